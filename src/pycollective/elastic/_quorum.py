"""The membership rule, sans I/O: given who registered for a round, who of the previous
membership is known dead and whether the wait is over, decide the round (or not yet).

A round t is decided once, by compare-and-set in the store, so every member adopts the same
decision. The rules:

- Round 0 (no previous membership): decided when `initial` members registered, or at the
  join timeout with at least `min_size`.
- Later rounds: only members of round t - 1 decide (a newcomer never does, so it cannot
  form a job of its own). A round is ready when every member of round t - 1 registered or
  is known dead (its store lease ended: the kernel closed its dead process's socket, so it
  cannot be on the other side of a partition). At the join timeout, members that are alive
  but silent still count: the round needs a strict majority of round t - 1's live members,
  otherwise it fails, and the job with it, on every member. A partition without a majority
  therefore raises everywhere; one with a majority goes on, and the rest raise or rejoin.
- The members keep their order from round t - 1 (so ranks move as little as possible);
  newcomers follow in the order they registered, up to `max_size`.
- The training state flows from a donor: the first member at the highest committed step
  (ties broken by the round that step was committed in: a later round's commit is the one
  the job went on with). Every member whose (step, commit round) differs, and every
  newcomer, receives the donor's state, so the step in flight is either committed on every
  member or on none, and a member that was left out of a round and comes back with a step
  of its own (committed in a group the job did not go on with) adopts the job's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Registration:
    """What a member says when it registers for a round."""

    uid: str
    step: int  # steps it has committed
    fresh: bool  # it has never held the training state (a newcomer)
    host: str = ""
    pid: int = 0
    order: int = 1 << 30  # the launcher's RANK: the first round ranks members by it
    commit_round: int = -1  # the round its last committed step was committed in
    closed: tuple[str, ...] = ()  # members of the round before whose connections it saw close

    @property
    def version(self) -> tuple[int, int]:
        """What names its state: equal versions are equal states, bit for bit."""
        return (self.step, self.commit_round)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Registration:
        return cls(str(d["uid"]), int(d["step"]), bool(d["fresh"]), str(d.get("host", "")),
                   int(d.get("pid", 0)), int(d.get("order", 1 << 30)),
                   int(d.get("commit_round", -1)),
                   tuple(str(u) for u in d.get("closed", ())))  # fmt: skip


@dataclass(frozen=True)
class Decision:
    round: int
    members: tuple[Registration, ...] = ()
    failed: str = ""
    donor: str = ""  # uid whose state the others adopt ("" if nobody is behind)
    behind: tuple[str, ...] = field(default_factory=tuple)

    @property
    def uids(self) -> list[str]:
        return [m.uid for m in self.members]

    @property
    def max_step(self) -> int:
        return max((m.step for m in self.members if not m.fresh), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "members": [m.to_json() for m in self.members],
            "failed": self.failed,
            "donor": self.donor,
            "behind": list(self.behind),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Decision:
        return cls(
            int(d["round"]),
            tuple(Registration.from_json(m) for m in d.get("members", [])),
            str(d.get("failed", "")),
            str(d.get("donor", "")),
            tuple(d.get("behind", [])),
        )


def decide(
    round_: int,
    me: str,
    previous: list[str] | None,
    registered: list[Registration],
    dead: set[str],
    timed_out: bool,
    *,
    min_size: int,
    max_size: int,
    initial: int,
    held: bool = True,
) -> Decision | None:
    """The decision for round `round_` as `me` sees it, or None to wait longer.

    `previous`: the uids of round `round_` - 1 in rank order (None for the first round);
    `registered`: the live registrations in arrival order; `dead`: uids whose lease ended;
    `held`: some member has ever held the training state (a group formed), so a round
    without any holder cannot go on (else it starts from its first member's state).
    """
    alive = [r for r in registered if r.uid not in dead]
    seen: set[str] = set()
    regs = []
    for r in alive:  # a member's first registration counts
        if r.uid not in seen:
            seen.add(r.uid)
            regs.append(r)
    if previous is None:
        if len(regs) >= initial or (timed_out and len(regs) >= min_size):
            first = sorted(regs[:max_size], key=lambda r: r.order)  # stable: then arrival
            return _finish(round_, first, first_round=True)
        if timed_out:
            return Decision(
                round_,
                failed=f"round {round_}: {len(regs)} member(s) arrived within the join "
                f"timeout, fewer than the {min_size} needed",
            )
        return None
    if me not in previous:
        return None  # newcomers wait for the members to decide
    by_uid = {r.uid: r for r in regs}
    live_prev = [u for u in previous if u not in dead]
    came = [u for u in live_prev if u in by_uid]
    if len(came) < len(live_prev):
        if not timed_out:
            return None
        if 2 * len(came) <= len(live_prev):
            silent = sorted(set(live_prev) - set(came))
            return Decision(
                round_,
                failed=f"round {round_}: no majority: {len(came)} of the {len(live_prev)} "
                f"live members of round {round_ - 1} arrived (silent: {', '.join(silent)}); "
                "a partition without a majority cannot go on",
            )
    newcomers = [r for r in regs if r.uid not in previous]
    members = [by_uid[u] for u in came] + newcomers
    members = members[:max_size]
    if len(members) < min_size:
        if not timed_out:
            return None  # wait for replacements up to the join timeout
        return Decision(
            round_,
            failed=f"round {round_}: {len(members)} member(s) left, fewer than the "
            f"{min_size} needed",
        )
    return _finish(round_, members, first_round=not held)


def _finish(round_: int, members: list[Registration], first_round: bool) -> Decision:
    holders = [m for m in members if not m.fresh]
    if not holders:
        if not first_round:
            return Decision(
                round_,
                failed=f"round {round_}: no member holds the training state (every member "
                "that did was lost, or the job finished)",
            )
        # The first round: everyone starts from member 0's state, as DDP broadcasts it.
        donor = members[0].uid
        behind = tuple(m.uid for m in members[1:])
        return Decision(round_, tuple(members), donor=donor, behind=behind)
    top = max(m.version for m in holders)
    donor = next(m.uid for m in holders if m.version == top)
    behind = tuple(m.uid for m in members if m.fresh or m.version != top)
    return Decision(round_, tuple(members), donor=donor if behind else "", behind=behind)
