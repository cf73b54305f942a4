"""The split's pure logic: hashing, stickiness, weights, the file, the state file."""

from __future__ import annotations

import math

import orjson
import pytest

from inferwatch.serving.split import BUCKETS, ExperimentError, Split, bucket_bounds, parse_experiments, resolve_weights
from inferwatch.serving.weights_store import load_splits, save_weights, state_path

FILE = """
experiments:
  chat:
    name: canary-7
    variants:
      - {name: v1, upstream_url: "http://a:8000/", model: chat-a, weight: 0.5}
      - {name: v2, upstream_url: "http://b:8000", model: chat, weight: 0.5}
"""


def split(weights=(0.5, 0.5), name="canary-7") -> Split:
    spec = parse_experiments(FILE, "test").experiments["chat"]
    return Split.of("chat", spec.model_copy(update={"name": name}), weights)


def test_file_is_read_with_urls_normalised_and_the_served_names_renamed_back():
    s = Split.of("chat", parse_experiments(FILE, "test").experiments["chat"])
    assert [v.upstream_url for v in s.variants] == ["http://a:8000", "http://b:8000"]
    assert s.variants[0].rename == (b'"model":"chat-a"', b'"model":"chat"')
    assert s.variants[1].rename is None  # same name upstream: nothing to rewrite


def test_assignment_is_sticky_and_the_unit_id_is_a_hash_not_the_key():
    s = split()
    first = [s.assign(f"user-{i}") for i in range(200)]
    assert first == [s.assign(f"user-{i}") for i in range(200)]
    uids = [a.unit for _, a in first]
    assert all(uid is not None and len(uid) == 16 and "user" not in uid for uid in uids)
    assert len(set(uids)) == 200


def test_the_assignment_carries_the_experiment_epoch_and_the_variants_weight():
    s = split((0.9, 0.1))
    assert s.epoch == 0
    index, a = s.assign("alice")
    assert (a.experiment, a.epoch, a.weight) == (s.name, 0, s.weights[index])
    moved = s.with_weights((0.75, 0.25))
    assert moved.epoch == 1 and moved.with_weights((0.9, 0.1)).epoch == 2  # back to old weights: a new epoch
    assert moved.assign("alice")[1].epoch == 1


def test_the_salt_makes_experiments_independent():
    a, b = split(name="exp-a"), split(name="exp-b")
    same = sum(a.assign(f"u{i}")[0] == b.assign(f"u{i}")[0] for i in range(2000))
    assert 900 < same < 1100  # about half agree, as for independent coin flips


@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.9, 0.1), (0.99, 0.01)])
def test_shares_follow_the_weights(weights):
    s = split(weights)
    n = 20_000
    treated = sum(s.assign(f"user-{i}")[0] for i in range(n))
    expected = n * weights[1]
    assert abs(treated - expected) < 4 * math.sqrt(n * weights[0] * weights[1])  # 4 sigma


def test_without_a_unit_key_the_draw_is_random_per_request():
    s = split()
    draws = [s.assign(None) for _ in range(4000)]
    assert all(a.unit is None for _, a in draws)
    assert 1800 < sum(i for i, _ in draws) < 2200


def test_ramping_the_canary_up_keeps_every_unit_it_had():
    users = [f"u{i}" for i in range(5000)]
    previous: set[str] = set()
    for pct in (1, 5, 25, 50, 100):
        s = split((1 - pct / 100, pct / 100))
        canary = {u for u in users if s.assign(u)[0] == 1}
        assert previous <= canary
        previous = canary
    assert previous == set(users)


def test_zero_weight_never_assigned_and_bounds_cover_all_buckets():
    assert bucket_bounds((1.0, 0.0)) == (BUCKETS, BUCKETS)
    s = split((1.0, 0.0))
    assert {s.assign(f"u{i}")[0] for i in range(3000)} | {s.assign(None)[0] for _ in range(3000)} == {0}


def test_partial_weights_fill_the_one_left_out():
    s = split()
    assert resolve_weights(s, {"v2": 0.05}) == pytest.approx((0.95, 0.05))
    assert resolve_weights(s, {"v2": 0}) == (1.0, 0.0)  # roll back in one call
    assert resolve_weights(s, {"v1": 0.25, "v2": 0.75}) == (0.25, 0.75)


@pytest.mark.parametrize("given, field, words", [
    ({"v3": 0.5}, "weights.v3", "no variant 'v3'"),
    ({"v1": 0.5, "v2": 0.6}, "weights", "add up to 1"),
    ({"v2": -0.1}, "weights.v2", "between 0 and 1"),
    ({"v2": 1.5}, "weights.v2", "between 0 and 1"),
    ({"v2": "half"}, "weights.v2", "must be a number"),
    ({"v2": True}, "weights.v2", "must be a number"),
    ({"v2": float("nan")}, "weights.v2", "must be a number"),
    ({}, "weights", "must be an object"),
    ([0.5, 0.5], "weights", "must be an object"),
])
def test_bad_weights_are_refused_naming_the_field(given, field, words):
    with pytest.raises(ExperimentError) as err:
        resolve_weights(split(), given)
    assert err.value.field == field and words in str(err.value)


def test_more_than_one_variant_left_out_is_refused():
    three = FILE.replace('weight: 0.5}\n', 'weight: 0.25}\n', 1).replace(
        '      - {name: v2', '      - {name: v3, upstream_url: "http://c:1", model: c, weight: 0.25}\n      - {name: v2')
    s = Split.of("chat", parse_experiments(three, "t").experiments["chat"])
    with pytest.raises(ExperimentError, match="missing: v1, v3"):
        resolve_weights(s, {"v2": 0.5})


@pytest.mark.parametrize("text, words", [
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 0.7},"
     " {name: b, upstream_url: 'http://b', model: m, weight: 0.7}]}}", "add up to 1"),
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 0.5},"
     " {name: a, upstream_url: 'http://b', model: m, weight: 0.5}]}}", "unique"),
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 1}]}}",
     "at least 2"),
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'ftp://a', model: m, weight: 0.5},"
     " {name: b, upstream_url: 'http://b', model: m, weight: 0.5}]}}", "http://"),
    ("experiments: {chat: {name: 'has space', variants: []}}", "pattern"),
    ("experiments: {chat: {name: x, colour: red}}", "colour"),
    ("experiments: [", "not valid YAML"),
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 0.5},"
     " {name: b, upstream_url: 'http://b', model: m, weight: 0.5, params: {stream: false, max_tokens: 5}}]}}",
     "max_tokens, stream cannot be set by a variant"),
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 0.5},"
     " {name: b, upstream_url: 'http://b', model: m, weight: 0.5, params: [1]}]}}", "params"),
    ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 0.5},"
     " {name: b, upstream_url: 'http://b', model: m, weight: 0.5, params: {temperature: 99, top_p: 5}}]}}",
     r"^exp.yaml: experiments.chat.variants.1.params: .*temperature=99, top_p=5: vLLM would refuse[^;]*$"),
])
def test_bad_files_say_where(text, words):
    with pytest.raises(ExperimentError, match=words):
        parse_experiments(text, "exp.yaml")


def test_null_params_are_none():
    text = ("experiments: {chat: {name: x, variants: [{name: a, upstream_url: 'http://a', model: m, weight: 0.5,"
            " params: null}, {name: b, upstream_url: 'http://b', model: m, weight: 0.5}]}}")
    assert parse_experiments(text, "exp.yaml").experiments["chat"].variants[0].params == {}


def test_weights_persist_and_apply_to_the_same_experiment_only(tmp_path):
    f = tmp_path / "experiments.yaml"
    f.write_text(FILE)
    splits = load_splits(f)
    assert splits["chat"].weights == (0.5, 0.5)
    changed = {"chat": splits["chat"].with_weights((0.95, 0.05))}
    save_weights(f, changed)
    assert orjson.loads(state_path(f).read_bytes())["chat"]["weights"] == [0.95, 0.05]
    assert load_splits(f)["chat"].weights == (0.95, 0.05)  # a restart keeps them
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(state_path(f).name + ".")]  # no temp left

    f.write_text(FILE.replace("canary-7", "canary-8"))  # a new experiment: the file's weights
    assert load_splits(f)["chat"].weights == (0.5, 0.5)
    f.write_text(FILE.replace("weight: 0.5}", "weight: 0.6}", 1).replace("weight: 0.5}", "weight: 0.4}", 1))
    assert load_splits(f)["chat"].weights == (0.6, 0.4)  # the operator edited the weights: the file wins


def test_a_broken_state_file_is_ignored(tmp_path):
    f = tmp_path / "experiments.yaml"
    f.write_text(FILE)
    state_path(f).write_text("{not json")
    assert load_splits(f)["chat"].weights == (0.5, 0.5)


def test_a_state_file_that_no_longer_applies_is_logged_not_dropped_silently(tmp_path, caplog):
    f = tmp_path / "experiments.yaml"
    f.write_text(FILE)
    save_weights(f, {"chat": load_splits(f)["chat"].with_weights((1.0, 0.0))})  # a rollback
    f.write_text(FILE.replace("canary-7", "canary-8"))
    with caplog.at_level("WARNING"):
        assert load_splits(f)["chat"].weights == (0.5, 0.5)
    assert "not applied" in caplog.text and "canary-7" in caplog.text and "1, 0" in caplog.text
