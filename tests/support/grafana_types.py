"""The dashboards as TypeScript typed by Grafana's own definitions (``@grafana/schema`` of
the pinned Grafana line, each panel by its plugin's ``Options`` and ``FieldConfig``, each
target by ``@grafana/prometheus``'s query type), for ``tsc --strict``: an object literal
with a field its type does not know, or a value outside an enum, is an error.

JSON holds enum values as strings, which TypeScript's string enums do not accept;
``Loose`` turns each enum into the union of its values and leaves everything else as is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

TYPES_DIR = Path(__file__).resolve().parents[1] / "dashboards" / "grafana_types"
MODULES = TYPES_DIR / "node_modules"
COMPOSABLE = "@grafana/schema/dist/types/raw/composable"
# panel type -> the TypeScript type its panels are checked against
PANEL_TYPES = {"timeseries": "Typed<'timeseries', timeseries.Options, timeseries.FieldConfig>",
               "stat": "Typed<'stat', stat.Options, Record<string, never>>",
               "heatmap": "Typed<'heatmap', heatmap.Options, heatmap.FieldConfig>",
               "row": "Row"}

PRELUDE = f"""import type * as schema from '@grafana/schema';
import type * as timeseries from '{COMPOSABLE}/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as stat from '{COMPOSABLE}/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as heatmap from '{COMPOSABLE}/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen';
import type {{ Prometheus }} from '{MODULES}/grafana-prometheus-dataquery';

type Loose<T> = T extends string ? `${{T}}` : T extends object ? {{ [K in keyof T]: Loose<T[K]> }} : T;
type Typed<Kind, O, F> = Loose<Omit<schema.Panel, 'type' | 'options' | 'fieldConfig' | 'targets'> & {{
  type: Kind;
  options: O;
  fieldConfig: {{
    defaults: Omit<schema.FieldConfig, 'custom'> & {{ custom?: F }};
    overrides: schema.FieldConfigSource['overrides'];
  }};
  targets: Prometheus[];
}}>;
type Row = Loose<schema.RowPanel>;
type Board = Loose<Omit<schema.Dashboard, 'panels'>>;
"""


def typescript_module(docs: dict[str, dict]) -> str:
    """One constant per panel, typed by its kind, and one per dashboard without its panels."""
    out = [PRELUDE]
    for uid, doc in docs.items():
        name = uid.replace("-", "_")
        for panel in doc["panels"]:
            out.append(f"export const {name}_panel_{panel['id']}: {PANEL_TYPES[panel['type']]} = "
                       f"{json.dumps(panel, indent=1)};")
        rest = {key: value for key, value in doc.items() if key != "panels"}
        out.append(f"export const {name}: Board = {json.dumps(rest, indent=1)};")
    return "\n".join(out) + "\n"


def type_check(docs: dict[str, dict], tmp: Path) -> subprocess.CompletedProcess:
    """``tsc --strict`` over ``typescript_module(docs)``; ``make test`` installs the types."""
    assert (MODULES / ".installed").exists(), "Grafana's types are installed by `make test` (npm)"
    (tmp / "dashboards.ts").write_text(typescript_module(docs))
    (tmp / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "skipLibCheck": True, "target": "es2022",
                            "module": "commonjs", "moduleResolution": "node10", "types": [],
                            "baseUrl": ".", "paths": {"@grafana/*": [f"{MODULES}/@grafana/*"]}},
        "files": ["dashboards.ts"]}))
    return subprocess.run([str(MODULES / ".bin" / "tsc"), "-p", str(tmp / "tsconfig.json")],
                          capture_output=True, text=True, timeout=300)
