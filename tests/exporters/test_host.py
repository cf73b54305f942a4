"""Host filesystems and memory in the exporter: parsed right, read fresh at every scrape, a
missing or unreadable path visible as such and never a failed scrape."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.host import HostCollector, filesystem_usage, parse_meminfo
from inferwatch.exporters.metrics import HOST_SPECS
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from tests.support.fleet import fleet

MEMINFO = """\
MemTotal:       24683584 kB
MemFree:        16339512 kB
MemAvailable:   22640328 kB
Buffers:          119564 kB
Active(anon):    1202044 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
DirectMap1G:     8388608 kB
"""
KIB = 1024


def families(collector: HostCollector) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def by_path(family) -> dict[str, float]:
    return {s.labels["path"]: s.value for s in family.samples}


def meminfo_file(tmp_path: Path, text: str = MEMINFO) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(text)
    return path


def test_meminfo_fields_in_bytes():
    fields = parse_meminfo(MEMINFO)
    assert fields["MemTotal"] == 24683584 * KIB and fields["MemAvailable"] == 22640328 * KIB
    assert fields["Active(anon)"] == 1202044 * KIB
    assert fields["HugePages_Total"] == 0  # a count, not kB
    assert parse_meminfo("MemTotal: lots\nnonsense\n\nMemFree:  12 MB\n") == {}  # other shapes are skipped


def test_the_real_meminfo_parses():
    fields = parse_meminfo(Path("/proc/meminfo").read_text())
    assert 0 < fields["MemAvailable"] <= fields["MemTotal"]


def test_memory_series_from_meminfo(tmp_path):
    got = families(HostCollector([], meminfo=meminfo_file(tmp_path)))
    assert got["inferwatch_host_memory_available_bytes"].samples[0].value == 22640328 * KIB
    assert got["inferwatch_host_memory_total_bytes"].samples[0].value == 24683584 * KIB
    assert not [name for name in got if name.startswith("inferwatch_host_filesystem")]  # no path watched


def test_filesystem_usage_of_a_real_path_agrees_with_disk_usage(tmp_path):
    usage = filesystem_usage(os.statvfs(tmp_path))
    disk = shutil.disk_usage(tmp_path)  # free: f_bavail, total: f_blocks, as ours
    assert usage.size_bytes == disk.total
    assert abs(usage.avail_bytes - disk.free) <= 256 * 2**20  # others write meanwhile
    assert 0 < usage.avail_bytes <= usage.size_bytes


def test_watched_paths_are_exported_per_path_and_a_missing_one_says_so(tmp_path, caplog):
    missing = str(tmp_path / "not-mounted")
    collector = HostCollector([str(tmp_path), missing], meminfo=meminfo_file(tmp_path))
    with caplog.at_level(logging.WARNING):
        got = families(collector)
        families(collector)
    assert by_path(got["inferwatch_host_filesystem_up"]) == {str(tmp_path): 1.0, missing: 0.0}
    size = by_path(got["inferwatch_host_filesystem_size_bytes"])
    assert size == {str(tmp_path): shutil.disk_usage(tmp_path).total}  # no series for the missing path
    assert set(by_path(got["inferwatch_host_filesystem_avail_bytes"])) == {str(tmp_path)}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and missing in warnings[0]  # logged once, not at every scrape

    os.mkdir(missing)  # the path appears (a volume mounted, a database created)
    with caplog.at_level(logging.INFO):
        got = families(collector)
    assert by_path(got["inferwatch_host_filesystem_up"]) == {str(tmp_path): 1.0, missing: 1.0}
    assert any("can be read again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("error", [PermissionError(13, "Permission denied"), OSError(5, "Input/output error"),
                                   ValueError("embedded null byte")])
def test_a_path_statvfs_refuses_is_down_not_a_failed_scrape(tmp_path, error):
    def statvfs(path: str) -> os.statvfs_result:
        if path == "/refused":
            raise error
        return os.statvfs(path)

    got = families(HostCollector(["/refused", str(tmp_path)], statvfs=statvfs, meminfo=meminfo_file(tmp_path)))
    assert by_path(got["inferwatch_host_filesystem_up"]) == {"/refused": 0.0, str(tmp_path): 1.0}
    assert "/refused" not in by_path(got["inferwatch_host_filesystem_avail_bytes"])


def test_every_scrape_reads_the_filesystem_anew(tmp_path):
    free = iter([900, 800])
    real = os.statvfs(tmp_path)

    def statvfs(path: str) -> os.statvfs_result:
        fields = list(real)
        fields[4] = next(free)  # f_bavail
        return os.statvfs_result(fields)

    collector = HostCollector([str(tmp_path)], statvfs=statvfs, meminfo=meminfo_file(tmp_path))
    avail = [by_path(families(collector)["inferwatch_host_filesystem_avail_bytes"])[str(tmp_path)] for _ in range(2)]
    assert avail == [900 * real.f_frsize, 800 * real.f_frsize]


def test_without_meminfo_the_memory_series_are_left_out(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        gone = families(HostCollector([], meminfo=tmp_path / "absent"))
        old_kernel = families(HostCollector([], meminfo=meminfo_file(tmp_path, "MemTotal: 100 kB\n")))
    assert not [n for n in (*gone, *old_kernel) if n.startswith("inferwatch_host_memory")]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_watch_paths_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("INFERWATCH_EXPORTER_WATCH_PATHS", " /prometheus, ~/.cache/inferwatch,,/prometheus ")
    assert ExporterSettings().watch_paths == ("/prometheus", f"{tmp_path}/.cache/inferwatch")
    monkeypatch.delenv("INFERWATCH_EXPORTER_WATCH_PATHS")
    assert ExporterSettings().watch_paths == ()
    with pytest.raises(Exception) as info:
        ExporterSettings(watch_paths="data/drift")
    assert "watch_paths" in str(info.value) and "must be absolute: data/drift" in str(info.value)


def test_the_exporter_serves_host_series_next_to_the_gpus(tmp_path):
    """Through the real HTTP endpoint: one exposition that promtool accepts, with the GPU
    series, the watched paths (one of them missing) and the host's memory."""
    missing = str(tmp_path / "drift")
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.05, watch_paths=f"{tmp_path},{missing}"), fleet(1))
    exporter.start()
    server = make_server(exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics") as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        exporter.stop()
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr
    got = {f.name: f for f in text_string_to_metric_families(text)}
    assert "inferwatch_gpu_power_watts" in got
    assert by_path(got["inferwatch_host_filesystem_up"]) == {str(tmp_path): 1.0, missing: 0.0}
    assert by_path(got["inferwatch_host_filesystem_size_bytes"]) == {str(tmp_path): shutil.disk_usage(tmp_path).total}
    assert 0 < got["inferwatch_host_memory_available_bytes"].samples[0].value \
        <= got["inferwatch_host_memory_total_bytes"].samples[0].value
    for spec in HOST_SPECS:  # what the catalog and the alerts know is what is served
        assert got[spec.name].type == spec.kind and got[spec.name].documentation == spec.doc
        assert all(set(s.labels) == set(spec.label_names) for s in got[spec.name].samples), spec.name
