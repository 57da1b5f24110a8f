"""Merge the flight-recorder dumps of a job and say which rank is behind, and at which call
(the library half of `pycollective diagnose DIR`, cli/diagnose.py).

Each rank's dump (see flight.py) lists its last operations with the group, sequence
number, collective, sizes, state and timings. Per group, the ranks' positions are
compared: the rank whose last collective is the earliest is behind (it never reached the
call the others wait in), and two ranks whose entries with the same sequence number
describe different calls disagree (a mismatch). A rank with no dump is reported too: it
may have died, or it never failed and was never asked (send it SIGUSR1).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .flight import FORMAT

_SIGNATURE = ("kind", "count", "dtype", "op", "root", "algorithm")


@dataclass
class Finding:
    """One conclusion, as text plus the facts it rests on (for --json)."""

    text: str
    facts: dict[str, Any] = field(default_factory=dict)


def load(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Every dump under `paths` (directories are searched, non-dumps skipped)."""
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files.extend(
                os.path.join(p, name) for name in sorted(os.listdir(p)) if name.endswith(".json")
            )
        else:
            files.append(p)
    dumps = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT:
            data["_path"] = path
            dumps.append(data)
    return dumps


def _latest_per_rank(dumps: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    by_rank: dict[int, dict[str, Any]] = {}
    for d in dumps:
        r = int(d["rank"])
        if r not in by_rank or d["time"] > by_rank[r]["time"]:
            by_rank[r] = d
    return by_rank


def _describe(e: dict[str, Any]) -> str:
    if e["kind"] in ("p2p", "monitored_barrier"):
        return e.get("detail") or e["kind"]
    parts = [f"count={e['count']}", f"dtype={e['dtype']}"]
    if e.get("op") is not None:
        parts.append(f"op={e['op']}")
    parts += [f"root={e['root']}", f"algorithm={e['algorithm']}"]
    return f"{e['kind']} #{e['seq']}({', '.join(parts)})"


def _state(e: dict[str, Any]) -> str:
    if e["state"] == "running":
        return f"running for {e['duration_s']:.1f} s"
    if e["state"] == "queued":
        return f"queued for {e['queued_s']:.1f} s"
    if e["state"] == "failed":
        return f"failed: {e['error']}"
    return "completed"


def analyze_job(dumps: list[dict[str, Any]]) -> list[Finding]:
    """What one job's dumps say: missing ranks, mismatches, and who is behind where."""
    by_rank = _latest_per_rank(dumps)
    world = max(int(d["world_size"]) for d in by_rank.values())
    findings: list[Finding] = []
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        findings.append(Finding(
            f"no dump from rank(s) {missing}: dead, or alive and never failed "
            "(send it SIGUSR1 to make it dump)",
            {"missing": missing},
        ))  # fmt: skip

    # group -> rank -> its entries (collectives only: they carry sequence numbers)
    groups: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    names: dict[int, str] = {}
    for rank, d in by_rank.items():
        for e in d["entries"]:
            if e["seq"] is not None and e["seq"] >= 0:
                groups[e["group"]][rank].append(e)
                names[e["group"]] = e["group_name"]

    blamed: dict[int, set[int]] = defaultdict(set)  # culprits named by errors, per group
    for rank, d in by_rank.items():
        for e in d["entries"]:
            if e["state"] == "failed":
                blamed[e["group"]].update(c for c in e.get("culprits", []) if c != rank)

    for gid, per_rank in sorted(groups.items()):
        gname = names.get(gid) or str(gid)
        # 1. disagreements: the same sequence number describing different calls
        by_seq: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
        for rank, entries in per_rank.items():
            for e in entries:
                by_seq[e["seq"]][rank] = e
        for seq in sorted(by_seq):
            calls = by_seq[seq]
            sigs = {r: tuple(e[k] for k in _SIGNATURE) for r, e in calls.items()}
            if len(set(sigs.values())) > 1:
                sides = "; ".join(f"rank {r} called {_describe(calls[r])}" for r in sorted(calls))
                findings.append(Finding(
                    f"group {gname}: ranks disagree at call #{seq}: {sides}",
                    {"group": gid, "seq": seq, "mismatch": sorted(calls)},
                ))  # fmt: skip
                break  # later calls follow from the first disagreement
        # 2. positions: each rank's last collective in this group
        last = {r: max(es, key=lambda e: e["id"]) for r, es in per_rank.items()}
        front = max(e["seq"] for e in last.values())
        lead = sorted(r for r, e in last.items() if e["seq"] == front)
        lead_e = last[lead[0]]
        behind = {r: e for r, e in last.items() if e["seq"] < front}
        # members with no entry in the group at all (no dump, or never called it)
        silent = sorted((blamed[gid] - set(last)) | (set(missing) & blamed[gid]))
        if behind:
            for r in sorted(behind, key=lambda r: (behind[r]["seq"], r)):
                e = behind[r]
                findings.append(Finding(
                    f"group {gname}: rank {r} is behind: its last call was {_describe(e)} "
                    f"({_state(e)}), while rank(s) {lead} are in {_describe(lead_e)} "
                    f"({_state(lead_e)})",
                    {"group": gid, "behind": r, "at_seq": e["seq"], "lead_seq": front},
                ))  # fmt: skip
        if silent:
            lost = (lead_e.get("error") or "").startswith("TransportError")
            what = (
                f"were lost while rank(s) {lead} were in {_describe(lead_e)}"
                if lost
                else f"never reached {_describe(lead_e)}: rank(s) {lead} waited on them there"
            )
            findings.append(Finding(
                f"group {gname}: rank(s) {silent} {what} ({_state(lead_e)})",
                {"group": gid, "behind": silent, "at_seq": front, "lost": lost},
            ))  # fmt: skip
        if not behind and not silent:
            states = {r: e["state"] for r, e in last.items()}
            if all(s == "completed" for s in states.values()):
                text = f"group {gname}: every rank completed {_describe(lead_e)}; none is behind"
            else:
                text = f"group {gname}: every rank is at {_describe(lead_e)}: " + ", ".join(
                    f"rank {r} {_state(last[r])}" for r in sorted(last)
                )
            findings.append(Finding(text, {"group": gid, "seq": front}))
    return findings


def analyze(dumps: list[dict[str, Any]]) -> dict[str, list[Finding]]:
    """Findings per job, most recent job first."""
    jobs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in dumps:
        jobs[str(d.get("job"))].append(d)
    order = sorted(jobs, key=lambda j: max(d["time"] for d in jobs[j]), reverse=True)
    return {j: analyze_job(jobs[j]) for j in order}


__all__ = ["Finding", "analyze", "analyze_job", "load"]
