"""Write lm-eval tasks for a meshrl (verl-style) parquet: one task per data source.

    python examples/lm_eval/write_tasks.py runs/smollm2/data/test.parquet runs/smollm2/lm_eval
    lm_eval --include_path runs/smollm2/lm_eval --tasks meshrl_heldout --apply_chat_template ...

For each ``data_source`` the output directory gets ``<task>.jsonl`` (the rows: the user
message, the ground truth, the data source, the scorer's keyword arguments) and ``<task>.yaml`` (a ``generate_until`` task on
that local file: no hub), plus ``meshrl_scoring.py`` (scores with meshrl's own scorer) and a
group ``meshrl_heldout`` of all of them. Task names are ``meshrl_<source>`` with ``/`` -> ``_``.
Only a single-turn user prompt is supported (what lm-eval's chat template path sends).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def task_name(source: str) -> str:
    return "meshrl_" + re.sub(r"[^A-Za-z0-9_]", "_", source)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parquet", help="verl-style rows (meshrl make-dataset's test.parquet)")
    p.add_argument("out_dir")
    p.add_argument("--max-gen-toks", type=int, default=32, help="answer budget (data.max_response_length)")
    p.add_argument("--reward-kwargs", default="{}", help="JSON: the job's reward.custom_reward_function.reward_kwargs")
    args = p.parse_args()
    import pyarrow.parquet as pq

    kwargs = json.loads(args.reward_kwargs)
    if not isinstance(kwargs, dict):
        raise SystemExit(f"--reward-kwargs must be a JSON object, got {args.reward_kwargs!r}")
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    by_source: dict[str, list[dict]] = {}
    for row in pq.read_table(args.parquet).to_pylist():
        msgs = row["prompt"]
        if len(msgs) != 1 or msgs[0]["role"] != "user":
            raise SystemExit(f"{args.parquet}: only single user-message prompts are supported, got {msgs!r}")
        by_source.setdefault(row["data_source"], []).append(
            {"question": msgs[0]["content"], "ground_truth": row["reward_model"]["ground_truth"],
             "data_source": row["data_source"], "scorer_kwargs": json.dumps(kwargs)})
    names = []
    for source, rows in sorted(by_source.items()):
        name = task_name(source)
        names.append(name)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {out / f'{name}.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: ""
generation_kwargs:
  until: []
  max_gen_toks: {args.max_gen_toks}
  do_sample: false
  temperature: 0.0
process_results: !function meshrl_scoring.process_results
metric_list:
  - metric: score
    aggregation: mean
    higher_is_better: true
  - metric: exact
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""")
    (out / "meshrl_heldout.yaml").write_text("group: meshrl_heldout\ntask:\n" + "".join(f"  - {n}\n" for n in names)
                                             + "aggregate_metric_list:\n  - metric: score\n    weight_by_size: true\n"
                                             + "metadata:\n  version: 1.0\n")
    shutil.copy(HERE / "meshrl_scoring.py", out / "meshrl_scoring.py")
    print(f"wrote {len(names)} lm-eval tasks ({', '.join(names)}) and the group meshrl_heldout to {out}")


if __name__ == "__main__":
    main()
