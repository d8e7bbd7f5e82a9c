"""Speculation statistics: tau, acceptance per depth, the budget of each step, and where the time goes.

The budget of a step is its draft nodes (0: a plain decode step); under --budget auto it is the
policy's choice (spec/bandit.py), so its histogram and sequence show what the policy did."""

from __future__ import annotations

from dataclasses import dataclass, field

BUDGET_SEQUENCE_MAX = 512  # steps whose budget is kept in order, per request


@dataclass
class SpecStats:
    passes: int = 0  # target verify passes (plain decode steps count as passes of one token)
    committed: int = 0  # tokens committed by those passes (accepted + bonus)
    proposed_per_depth: list[int] = field(default_factory=list)  # [depth-1]: passes whose tree reached that depth
    accepted_per_depth: list[int] = field(default_factory=list)  # [depth-1]: passes that accepted a node there
    nodes: int = 0  # draft nodes verified in total
    steps_per_budget: dict[int, int] = field(default_factory=dict)  # budget (draft nodes) -> steps
    budget_sequence: list[int] = field(default_factory=list)  # the first BUDGET_SEQUENCE_MAX steps' budgets
    draft_s: float = 0.0
    verify_s: float = 0.0
    rest_s: float = 0.0

    def record(self, max_depth: int, num_accepted: int, num_nodes: int) -> None:
        self.passes += 1
        self.committed += num_accepted + 1
        self.nodes += num_nodes
        self.steps_per_budget[num_nodes] = self.steps_per_budget.get(num_nodes, 0) + 1
        if len(self.budget_sequence) < BUDGET_SEQUENCE_MAX:
            self.budget_sequence.append(num_nodes)
        while len(self.proposed_per_depth) < max_depth:
            self.proposed_per_depth.append(0)
            self.accepted_per_depth.append(0)
        for d in range(max_depth):
            self.proposed_per_depth[d] += 1
        for d in range(num_accepted):
            self.accepted_per_depth[d] += 1

    @property
    def tau(self) -> float:
        return self.committed / self.passes if self.passes else 0.0

    def acceptance_per_depth(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_depth, self.proposed_per_depth)]

    def merge(self, other: "SpecStats") -> None:
        self.passes += other.passes
        self.committed += other.committed
        self.nodes += other.nodes
        self.draft_s += other.draft_s
        self.verify_s += other.verify_s
        self.rest_s += other.rest_s
        for b, n in other.steps_per_budget.items():  # (the sequence is per request: not merged)
            self.steps_per_budget[b] = self.steps_per_budget.get(b, 0) + n
        for name in ("proposed_per_depth", "accepted_per_depth"):
            mine, theirs = getattr(self, name), getattr(other, name)
            while len(mine) < len(theirs):
                mine.append(0)
            for i, v in enumerate(theirs):
                mine[i] += v

    def as_dict(self) -> dict:
        return {
            "passes": self.passes,
            "committed": self.committed,
            "tau": round(self.tau, 4),
            "acceptance_per_depth": [round(a, 4) for a in self.acceptance_per_depth()],
            "draft_nodes": self.nodes,
            "budget": {
                "mean": round(self.nodes / self.passes, 3) if self.passes else 0.0,
                "steps_per_budget": {str(b): n for b, n in sorted(self.steps_per_budget.items())},
                "per_step": list(self.budget_sequence),
                "per_step_truncated": self.passes > len(self.budget_sequence),
            },
            "time_s": {"draft": round(self.draft_s, 4), "verify": round(self.verify_s, 4), "rest": round(self.rest_s, 4)},
        }
