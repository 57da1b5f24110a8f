"""The elastic mode's part of the demo report: what happened (from the leader's steps log
and every member's FINAL line), as text and as a loss curve with the lost worker and its
replacement marked."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import report


def summarize(steps_log: Path, launcher_log: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in steps_log.read_text().splitlines() if line.strip()]
    steps = [r for r in lines if "step" in r]
    kills = [r for r in lines if "killed" in r]
    finals = [json.loads(m) for m in re.findall(r"FINAL (\{.*\})$", launcher_log, re.M)]
    out: dict[str, Any] = {"steps": steps, "finals": finals}
    if kills:
        k = kills[0]
        after = [s for s in steps if s["t"] > k["t"]]
        before = [s for s in steps if s["t"] <= k["t"]]
        out["killed_in_update"] = k["killed"]
        out["committed_before_kill"] = before[-1]["step"] if before else 0
        # from the kill to the survivors' next committed update (the redone one)
        out["recovery_s"] = after[0]["t"] - k["t"] if after else None
        out["resumed_at_update"] = after[0]["step"] if after else None
        grown = [s for s in after if s["members"] > min(x["members"] for x in after)]
        out["rejoined_at_update"] = grown[0]["step"] if grown else None
    joined = [f for f in finals if f["rounds"] and f["rounds"][0]["round"] > 0]
    if joined and joined[0]["first_commit"]:
        j = joined[0]
        out["replacement_s"] = j["first_commit"] - j["started"]
        out["replacement_startup_s"] = j["ready"] - j["started"]  # imports, data, model
        out["replacement_join_s"] = j["first_commit"] - j["ready"]  # manager, round, a step
        out["replacement_cpu_s"] = j["cpu_at_first_commit"]
    out["identical"] = len({f["digest"] for f in finals}) == 1
    out["members_at_end"] = len(finals)
    out["updates"] = steps[-1]["step"] if steps else 0
    gaps = [b["step"] - a["step"] for a, b in zip(steps[:-1], steps[1:], strict=True)]
    out["continuous"] = bool(steps) and all(g == 1 for g in gaps) and steps[0]["step"] == 1
    return out


def text(section: dict[str, Any]) -> list[str]:
    s = section
    lines = [f"Elastic training ({s['workers']} workers, `pycollective run --elastic "
             f"{s['elastic']}`, the small CNN, global batch {s['batch']}):"]  # fmt: skip
    if "killed_in_update" in s:
        rec = s.get("recovery_s")
        lines.append(
            f"- a worker was SIGKILLed in update {s['killed_in_update']}; the survivors were "
            f"training again after {rec:.2f} s (update {s['resumed_at_update']} "
            f"{'redone' if s['resumed_at_update'] == s['killed_in_update'] else 'committed'})"
            if rec is not None
            else "- a worker was SIGKILLed; the survivors did not go on"
        )
    if s.get("replacement_s") is not None:
        lines.append(
            f"- its replacement was in step {s['replacement_s']:.2f} s after it started, from "
            f"update {s.get('rejoined_at_update')}: {s['replacement_startup_s']:.2f} s of "
            f"imports, data and model, {s['replacement_join_s']:.2f} s to join and commit a step;"
            f" {s['replacement_cpu_s']:.2f} s of its own CPU time"
        )
    lines.append(
        f"- {s['members_at_end']} members finished {s['updates']} updates, "
        f"{'bit for bit identical' if s['identical'] else 'NOT IDENTICAL'}; the loss curve "
        f"{'has every update once' if s['continuous'] else 'has gaps'}"
        f"; probe accuracy {s.get('probe_accuracy', float('nan')):.4f}"
    )
    lines.append(f"- wrote {s['plot']}")
    return lines


def plot(section: dict[str, Any], path: Path) -> Path:
    plt = report._matplotlib()
    steps = section["steps"]
    xs = [r["step"] for r in steps]
    ys = [r["loss"] for r in steps]
    fig, (ax, am) = plt.subplots(2, 1, figsize=(8.5, 5.5), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1]})  # fmt: skip
    ax.plot(xs, ys, color="0.6", linewidth=0.6, label="loss of each update (its global batch)")
    k = 25
    smooth = [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1])
              for i in range(len(ys))]  # fmt: skip
    ax.plot(xs, smooth, color="tab:blue", linewidth=1.8, label=f"mean of the last {k}")
    for a in (ax, am):
        if section.get("killed_in_update"):
            a.axvline(section["killed_in_update"], color="tab:red", linestyle="--")
        if section.get("rejoined_at_update"):
            a.axvline(section["rejoined_at_update"], color="tab:green", linestyle="--")
    ax.plot([], [], color="tab:red", linestyle="--", label="a worker killed (kill -9)")
    ax.plot([], [], color="tab:green", linestyle="--", label="its replacement in step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    rec, rep = section.get("recovery_s"), section.get("replacement_s")
    title = "Fashion-MNIST, small CNN, 4 workers, elastic: no restart, every update once"
    if rec is not None:
        title += f"\ntraining again {rec:.2f} s after the kill"
    if rep is not None:
        title += f", replacement in step {rep:.1f} s after its start"
    ax.set_title(title, fontsize=9)
    am.step(xs, [r["members"] for r in steps], where="post", color="black")
    am.set_ylabel("members")
    am.set_xlabel("update")
    am.set_ylim(0, max(r["members"] for r in steps) + 1)
    am.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
