"""The Markdown of ``bench/heldout_study.py``: its results (plain dicts) as tables and sentences.

Every sentence of the result is generated from the numbers, so it reads the same whichever way they go:
an interval above (below) 1 for a ratio, 0 for a difference, says so; one that holds it says that.
What the tables name (the static configurations, the learner variants, the oracle) comes in ``meta``.
"""

from __future__ import annotations

import json
import math

from autoprofiler.heldout import OBJECTIVES

PAPER_KS = (2, 4, 6, 8)
UNITS = {
    "log_speedup": ("geomean effective speedup", "ratio to the best static (train)", "ratio"),
    "reward": ("mean clipped reward max(0, log s)", "difference to the best static (train)", "difference"),
}


def fmt_iv(d: dict | None, digits: int = 3) -> str:
    if not d:
        return "n/a"
    return f"{d['estimate']:.{digits}f} [{d['low']:.{digits}f}, {d['high']:.{digits}f}]"


def fmt(v, spec: str = ".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def verdict(d: dict | None, objective: str) -> str:
    """Where a ratio (log_speedup) or difference (reward) interval lies relative to no change."""
    if not d:
        return "no paired tasks"
    null = 1 if objective == "log_speedup" else 0
    if d["low"] > null:
        return f"above {null}"
    if d["high"] < null:
        return f"below {null}"
    return f"the interval holds {null}"


def random_name(policies: dict) -> str:
    return next(n for n in policies if n.startswith("random"))


def policy_table(r: dict, meta: dict, objective: str, n_train: int, n_held: int) -> list[str]:
    o = r["objectives"][objective]
    value, delta, _ = UNITS[objective]
    lines = [
        f"| policy | held out: answered / {n_held} | {value} [95% CI] | {delta} [95% CI] | "
        f"train ({n_train}): value (answered) | passes / task (held out) |",
        "| --- | ---: | --- | --- | ---: | ---: |",
    ]
    for name, s in o["policies"].items():
        h, t = s["held_out"], s["train"]
        label = f"**{name}**: {o['best_static']}" if name == meta["best"] else name
        lines.append(
            f"| {label} | {h['answered']} | {fmt_iv(h['value'])} | {fmt_iv(h['vs_reference'])} | "
            f"{fmt(t['value'] and t['value']['estimate'])} ({t['answered']}) | {h['passes_per_task']:.1f} |"
        )
    return lines


def metric_table(r: dict, objective: str) -> list[str]:
    lines = [
        "| k | exactly k: eligible / subsets, ties on train | train | held out [95% CI] (range over ties) "
        "| passes | at most k: ties | held out [95% CI] | mean k-subset, held out | oracle within k, "
        "held out | best k-subset chosen on held out (in-sample) |",
        "| ---: | --- | ---: | --- | ---: | ---: | --- | --- | --- | --- |",
    ]
    for x in r["objectives"][objective]["metric_count"]["rows"]:
        e, a = x["exact"], x["at_most"]
        spread = f" ({e['tie_range'][0]:.3f}-{e['tie_range'][1]:.3f})" if e.get("tie_range") else ""
        c = x.get("ceiling")
        ceiling = f"{fmt_iv(c['value'])} {'+'.join(c['subset']) or 'blind'}" if c else "n/a"
        oracle = fmt_iv(x["oracle"]) + (" (lower bound)" if x["oracle"]["lower_bound"] else "")
        k = f"**{x['k']}**" if x["k"] in PAPER_KS else str(x["k"])
        lines.append(
            f"| {k} | {e['eligible']}/{e['candidates']}, {e.get('ties', 0)} | {fmt(e.get('train'))} | "
            f"{fmt_iv(e.get('value'))}{spread} | {fmt(e.get('passes_per_task'), '.1f')} | "
            f"{a.get('ties', 0)} | {fmt_iv(a.get('value'))} | {fmt_iv(x['mean_subset'])} | {oracle} | "
            f"{ceiling} |"
        )
    return lines


def compare_text(comparisons: dict, objective: str, what: str) -> str:
    word = UNITS[objective][2]
    return "; ".join(
        f"{what}, {pair.replace('-', ' vs ')} groups: {word} {fmt_iv(d)} ({verdict(d, objective)})"
        for pair, d in comparisons.items()
    )


def variants(meta: dict, objective: str) -> list[dict]:
    """The learner variants trained with ``objective`` (name, objective, control, fraction)."""
    return [v for v in meta["learner_variants"] if v["objective"] == objective]


def key_table(results: list[dict], meta: dict) -> list[str]:
    heads = [v["name"].replace("(log_speedup, ", "(") for v in variants(meta, "log_speedup")]
    lines = [
        "| rewriter | objective | best static (train) | its held-out value | "
        + " | ".join(f"{h} / best static" for h in heads)
        + " | seed tree / best static | blind / best static | random / best static"
        + " | oracle (4) / best static |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in range(len(heads) + 4)) + " |",
    ]
    for r in results:
        for objective in OBJECTIVES:
            o = r["objectives"][objective]
            p = o["policies"]
            best = o["best_static"]
            names = [v["name"] for v in variants(meta, objective)]
            names += ["seed tree", "blind", random_name(p), meta["oracle"]]
            cells = [fmt_iv(p[n]["held_out"]["vs_reference"]) for n in names]
            lines.append(
                f"| {r['rewriter']} | {objective} | {best} | "
                f"{fmt_iv(p[meta['best']]['held_out']['value'])} | " + " | ".join(cells) + " |"
            )
    return lines


def learner_lines(r: dict) -> list[str]:
    lines = [
        "| learner (objective, error control, selection fraction) | training tasks (proposal / acceptance) "
        "| level per decision | decisions | accepted | tree |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for info in r["learned"].values():
        tree = "the seed tree" if info["is_seed_tree"] else f"`{info['tree']}`: {info['leaves']}"
        lines.append(
            f"| {info['objective']}, {info['error_control']}, {info['selection_fraction']} | "
            f"{info['train_tasks']} ({info['proposal_tasks']} / {info['acceptance_tasks']}) | "
            f"{info['level']:.4g} | {info['decisions']} | {'; '.join(info['accepted']) or 'none'} | {tree} |"
        )
    tested = [(k, d) for k, info in r["learned"].items() for d in info["log"] if d["p_sign_flip"] is not None]
    if tested:
        key, d = min(tested, key=lambda kd: (kd[1]["p_sign_flip"], -(kd[1]["mean_gain"] or 0.0)))
        lowest = min(i["level"] for i in r["learned"].values())
        lines += [
            "",
            f"Smallest sign-flip p-value of any tested decision: {d['p_sign_flip']:.4g} ({key}: "
            f"{d['description']}; {d['n']} acceptance tasks, {d['nonzero']} with a non-zero gain, mean gain "
            f"{fmt(d['mean_gain'], '.4f')}). m non-zero gains give no p-value below 2^-m, so the level "
            f"{lowest:.4g} needs at least {math.ceil(-math.log2(lowest))} affected acceptance tasks whose "
            "gains are all positive.",
        ]
    return lines


def per_task_table(r: dict, meta: dict) -> list[str]:
    names = ["blind", *[f"static:{n}" for n in meta["fixed"]], "seed tree"]
    names += [k for k, info in r["learned"].items() if not info["is_seed_tree"]]
    names += [meta["oracle"]]
    lines = [
        "| task | side | " + " | ".join(names) + " |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for t in sorted(r["per_task"], key=lambda x: (x["side"] != "held_out", x["task"])):
        cells = [f"{t[n][0]} {fmt(t[n][1], '.2f')}" if t[n][1] is not None else t[n][0] for n in names]
        lines.append(f"| {t['task']} | {t['side']} | " + " | ".join(cells) + " |")
    return lines


def cross_fitted_lines(r: dict, n_held: int) -> list[str]:
    cf = r["cross_fitted"]
    lines = [
        f"### Cross-fitted: each of the {n_held} held-out tasks scored by what was fitted on all other "
        "study tasks",
        "",
        f"Learner training tasks per fold: the other study tasks whose every subset is answered "
        f"({len(r['learner_train_tasks']) + len(r['learnable_held_out'])} less the one left out, when it "
        "is one of them). What the learner accepted over the folds:",
        "",
        "| learner | folds accepting an edit | edits accepted (folds) |",
        "| --- | ---: | --- |",
    ]
    for name, info in cf["learned"].items():
        edits = "; ".join(f"{e} ({n})" for e, n in info["accepted_edits"].items()) or "none"
        lines.append(f"| {name} | {info['folds_accepting']}/{cf['folds']} | {edits} |")
    for objective in OBJECTIVES:
        o = cf["objectives"][objective]
        value, _, word = UNITS[objective]
        bs = o["best_static"]
        picked = ", ".join(f"{n} {c}" for n, c in o["best_static_picked"].items())
        lines += [
            "",
            f"Under {objective}: the best static configuration chosen per fold ({picked} folds) gives "
            f"{fmt_iv(bs['value'])} over {bs['answered']} tasks ({value}).",
            "",
            f"| policy (cross-fitted) | answered | {value} [95% CI] | {word} to the cross-fitted best static "
            "[95% CI] |",
            "| --- | ---: | --- | --- |",
        ]
        for name, s in o["learned"].items():
            lines.append(f"| {name} | {s['answered']} | {fmt_iv(s['value'])} | {fmt_iv(s['vs_reference'])} |")
        for k, s in o["exact_k"].items():
            if int(k) in (1, *PAPER_KS, 10):
                lines.append(
                    f"| best subset of exactly {k} groups (mean ties {fmt(s['mean_ties'], '.1f')}) | "
                    f"{s['answered']} | {fmt_iv(s['value'])} | |"
                )
        lines += ["", "Paired: " + compare_text(o["compare_chosen"], objective, "chosen per fold") + "."]
    return lines


def result_lines(results: list[dict], meta: dict) -> list[str]:
    """The result under log_speedup, stated from the numbers (whichever way they go)."""
    out = []
    for r in results:
        o = r["objectives"]["log_speedup"]
        p = o["policies"]
        best = o["best_static"]
        parts = []
        for v in variants(meta, "log_speedup"):
            name = v["name"]
            h = p[name]["held_out"]
            parts.append(
                f"{v['control']} control{', selection 0' if v['fraction'] == 0 else ''}: "
                f"{len(r['learned'][name]['accepted'])} accepted, ratio {fmt_iv(h['vs_reference'])} "
                f"({verdict(h['vs_reference'], 'log_speedup')}, {h['answered']} tasks)"
            )
        orc = p[meta["oracle"]]["held_out"]
        rows = {x["k"]: x for x in o["metric_count"]["rows"]}
        chosen = " / ".join(fmt((rows[k]["exact"].get("value") or {}).get("estimate")) for k in PAPER_KS)
        eight_two = o["metric_count"]["compare_chosen"].get("8-2")
        mean_82 = o["metric_count"]["compare_mean_subset"].get("8-2")
        cf = r["cross_fitted"]["objectives"]["log_speedup"]
        run = variants(meta, "log_speedup")[0]["name"]  # the default: run-level control
        cf_run = cf["learned"][run]
        cf_accepting = r["cross_fitted"]["learned"][run]["folds_accepting"]
        cf_chosen = " / ".join(fmt((cf["exact_k"][k]["value"] or {}).get("estimate")) for k in PAPER_KS)
        out.append(
            f"- **{r['rewriter']}** ({r['in_sample']}). Best static on train: {best}, held out "
            f"{fmt_iv(p[meta['best']]['held_out']['value'])}. Learned trees / best static: "
            + "; ".join(parts)
            + f". Oracle over the 4 configurations / best static: {fmt_iv(orc['vs_reference'])} "
            f"({verdict(orc['vs_reference'], 'log_speedup')}, {orc['answered']} tasks). Best subset of "
            f"exactly k = 2 / 4 / 6 / 8 groups chosen on train, held out: {chosen}; 8 vs 2 groups: ratio "
            f"{fmt_iv(eight_two)} ({verdict(eight_two, 'log_speedup')}); the mean subset of 8 vs of 2 "
            f"groups: ratio {fmt_iv(mean_82)} ({verdict(mean_82, 'log_speedup')}). Cross-fitted: the "
            f"run-level learner accepted an edit in {cf_accepting}/{r['cross_fitted']['folds']} folds, "
            f"ratio to the cross-fitted best static {fmt_iv(cf_run['vs_reference'])} "
            f"({verdict(cf_run['vs_reference'], 'log_speedup')}); best exactly-k subsets: {cf_chosen}."
        )
    return out


def header_lines(results: list[dict], meta: dict) -> list[str]:
    split = meta["split"]
    n_train, n_held = len(split["train"]), len(split["held_out"])
    learners = "; ".join(
        f"{r['rewriter']} {len(r['learner_train_tasks'])}"
        + (
            f" (not {', '.join(t for t in split['train'] if t not in r['learner_train_tasks'])})"
            if len(r["learner_train_tasks"]) < n_train
            else ""
        )
        for r in results
    )
    return [
        f"# Held-out study on `{meta['recording']}` (replay, CPU)",
        "",
        f"`{meta['command']}` ({meta['seconds']:.0f} s on this CPU; bootstrap {meta['bootstrap']} resamples, "
        f"seed {meta['seed']}; random: {meta['random_seeds']} seeds averaged per task). Outcomes: the "
        f"effective speedups of the recording's `rule-v1` action rows "
        f"({', '.join(meta.get('devices') or ['H200'])}), one measurement per (task, action): "
        "sub-millisecond tasks move by 10-25% between runs (`datasets/h200_suite/HISTORY.md`). A cell is "
        "the action the rewriter chooses when shown the policy's groups of the recorded profile, answered by "
        "that action's recorded outcome; a choice of an action the recording has no row of is reported as "
        "coverage, never given a value.",
        "",
        "## The split (fixed first, from task content hashes alone)",
        "",
        f"Rule: {split['rule']} (`autoprofiler.heldout.study_split`, the playbook split of "
        f"`autoprofiler.rewriters.split`). Tasks recorded with every group: {n_train + n_held}; **training "
        f"side {n_train}, held out {n_held}**. Not in the study (a group missing from their recording): "
        f"{', '.join(meta['not_fully_recorded']) or 'none'}.",
        "",
        f"- training ({n_train}): {', '.join(split['train'])}",
        f"- held out ({n_held}): {', '.join(split['held_out'])}",
        "",
        "| rewriter | designed / fitted on | its held-out numbers are |",
        "| --- | --- | --- |",
        *(
            [
                "| rule-v2 | the whole recording (all 45 tasks' outcomes in view) | **in-sample** |",
                "| playbook-v1 | thresholds from the tuning split (14 tasks, 9 here), frozen before any "
                "held-out run | out of sample |",
            ]
            if meta.get("designed_on_this", True)
            else [
                "| rule-v2 | `datasets/h200_suite` (none of these tasks) | out of sample |",
                "| playbook-v1 | `datasets/h200_suite`'s tuning split (none of these tasks) "
                "| out of sample |",
            ]
        ),
        f"| experience-v1 | the tuning split's rows ({meta['experience_train']} tasks; checked: all tuning) "
        "| out of sample (training-side numbers in-sample) |",
        "",
        "Everything this script fits or chooses sees the training side only: the learned trees, the best "
        "static configuration, the best k-group subsets. They are fitted on the training tasks whose every "
        "subset has a recorded outcome (the learner cannot score a cell without one, and choosing among "
        "subsets scored on different tasks would not be a fair choice; which tasks these are depends on "
        f"the actions a rewriter chooses, not on outcomes): {learners}. The learner is `Learner` with "
        f"`StatisticalProposer` and train.yaml's `learn` settings {json.dumps(meta['learn'])}, objective, "
        "error control and selection fraction varied. `workflows/train.py`'s own split (by task id) is not "
        f"used: its training side holds tasks held out here. {n_train} training tasks (which the learner "
        f"halves again into proposal and acceptance tasks) and {n_held} held-out tasks; the cross-fitted "
        f"section fits on up to {n_train + n_held - 1} tasks per held-out task.",
    ]


def rewriter_lines(r: dict, meta: dict, n_train: int, n_held: int) -> list[str]:
    cov = r["coverage"]
    lacking = cov["held_out"]["tasks_with_unanswered"] | cov["train"]["tasks_with_unanswered"]
    missing = "; ".join(
        f"{t} ({v['share_answered']:.2f}: {', '.join(v['actions'])})" for t, v in lacking.items()
    )
    lines = [
        f"## {r['rewriter']} (`{r['identity']}`): {r['in_sample']}",
        "",
        f"Coverage: {cov['train']['cells_answered']:.3f} of (task, subset) cells answered on the training "
        f"side, {cov['held_out']['cells_answered']:.3f} held out"
        + (
            f"; tasks with unanswered cells (share answered: unrecorded actions chosen): {missing}"
            if missing
            else ""
        )
        + ". A policy's value is over the tasks it answers (`answered`); a random task counts as answered "
        "only when all its draws are.",
        "",
        "### What the learner did (training side)",
        "",
        *learner_lines(r),
        "",
    ]
    for objective in OBJECTIVES:
        o = r["objectives"][objective]
        scores = ", ".join(f"{n} {v:.3f}" for n, v in o["static_train_scores"].items())
        absent = [n for n in meta["fixed"] if n not in o["static_train_scores"]]
        lines += [
            f"### Policies under {objective} ({UNITS[objective][0]})",
            "",
            f"Training-side scores of the static configurations: {scores}"
            + (f" ({', '.join(absent)}: not answered on every training task)" if absent else "")
            + ".",
            "",
            *policy_table(r, meta, objective, n_train, n_held),
            "",
        ]
    oa = r["oracle_analysis_held_out"]
    if oa.get("tasks"):
        lo, hi = oa["relative_gain_ci"]
        lines += [
            "`oracle_analysis` on the held-out tasks (the best static re-chosen on them in every "
            f"resample, so selection is inside its interval): best static {oa['best_static']} "
            f"{oa['best_static_geomean']:.3f}, oracle {oa['oracle_geomean']:.3f}, relative gain "
            f"{oa['relative_gain']:.3f} [{lo:.3f}, {hi:.3f}] ({oa['tasks']} tasks; skipped: "
            f"{', '.join(oa['skipped']) or 'none'}).",
            "",
        ]
    for objective in OBJECTIVES:
        o = r["objectives"][objective]
        mc = o["metric_count"]
        lines += [
            f"### Metric count under {objective}",
            "",
            *metric_table(r, objective),
            "",
            "Paired over held-out tasks: "
            + compare_text(mc["compare_chosen"], objective, "chosen on train")
            + "; "
            + compare_text(mc["compare_mean_subset"], objective, "mean k-subset")
            + "; "
            + compare_text(mc["compare_oracle"], objective, "oracle within k")
            + f". Oracle over all 1,024 subsets, held out: {fmt_iv(o['oracle_all_subsets'])} (cells answered "
            f"{o['oracle_all_subsets']['cells_answered']:.3f}; over the "
            f"{o['oracle_all_subsets'].get('tasks', '?')} held-out tasks with one answered).",
            "",
        ]
    lines += [
        *cross_fitted_lines(r, n_held),
        "",
        "### Per task (action, effective speedup; learned trees equal to the seed tree left out)",
        "",
        *per_task_table(r, meta),
        "",
    ]
    return lines


def markdown(results: list[dict], meta: dict) -> str:
    n_train, n_held = len(meta["split"]["train"]), len(meta["split"]["held_out"])
    lines = [
        *header_lines(results, meta),
        "",
        "## Result (log effective speedup; the reward tables are below)",
        "",
        *result_lines(results, meta),
        "",
        "## Key comparisons (held out, paired over tasks both answer; 95% bootstrap CI)",
        "",
        "Under log_speedup a cell is a ratio of geomeans, under reward a difference of mean rewards. "
        "The best static configuration is chosen on the training side by the same objective; "
        "configurations tied there (`a = b`) are averaged per task. The learned trees are those "
        "trained with the row's objective.",
        "",
        *key_table(results, meta),
        "",
        "## Reading the metric-count tables",
        "",
        "exactly k: the subsets of k groups answered on every fitting task, of all subsets of k "
        "groups, and how many tie at the best training mean; held out: per task the mean over the tied "
        "subsets (range: the tied subsets one by one). at most k: the same over subsets of up to k groups. "
        "mean k-subset: per task the mean over its answered k-subsets. oracle within k: per task the best "
        "answered k-subset (a lower bound where cells are unanswered). The last column: the one k-subset "
        "best on the held-out tasks themselves (in-sample, a ceiling for any choice). k = 0 is blind. "
        "The oracle within exactly k picks among C(10, k) subsets (45 at k = 2 and 8, 210 at k = 4 and 6, "
        "1 at k = 10), so its comparisons say as much about the number of choices as about k. For "
        "scale, the paper's claim (an LLM writing kernels on KernelBench, its best tree limited to k "
        "metrics): 1.299x with 2, 1.370x with 4, 1.261x with 6, 1.231x with 8; here a rewriter picks "
        "one of five recorded torch-level actions, so the two are not the same experiment.",
        "",
    ]
    for r in results:
        lines += rewriter_lines(r, meta, n_train, n_held)
    return "\n".join(lines)
