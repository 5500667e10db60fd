"""`tiermesh bench --scenario drift` end to end at a small size: its own mesh of echo tiers, a
seeded stream of 300 routed chats whose mix changes after 150, sent once through the router on
the adaptive policy and once on cost_target, each answer scored and sent back as Feedback; the
JSON's shape, and every Feedback applied by the router. (Accuracy and cost are for the benchmark,
not the test: echo tiers answer no question right.)"""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.run_process import ROOT, TIERMESH, json_command

POLICIES = ("adaptive", "cost_target")


@pytest.mark.timeout(300)
def test_drift_scenario_through_the_router_with_feedback(tmp_path) -> None:
    command = ["bench", "--scenario", "drift", "--engine", "echo", "--max-tokens", "8"]
    command += ["--drift-before", "150", "--drift-after", "150", "--seed", "3", "--json"]
    report, stderr = json_command(command, tmp_path / "run", timeout=280)
    assert report["benchmark"] == "routing_drift"
    scenario = report["scenario"]
    assert (scenario["before_requests"], scenario["after_requests"], scenario["seed"]) == (
        150,
        150,
        3,
    )
    assert scenario["after_mix"]["complex"] > scenario["before_mix"]["complex"]
    assert list(report["policies"]) == list(POLICIES)
    for name, summary in report["policies"].items():
        before, after = summary["before"], summary["after"]
        assert (before["requests"], after["requests"]) == (150, 150), name
        answered = before["answered"] + after["answered"]
        assert answered > 0 and sum(after["answered_by"].values()) == after["answered"]
        # every answered chat's score went back as Feedback, and the router applied each
        assert summary["feedback"] == {"sent": answered, "accepted": answered}, name
        for part in (before, after):
            assert set(part) >= {"accuracy", "accuracy_ci95", "cost", "tier_cost_vs_large"}
        assert 0 < len(summary["after_accuracy_by_window"]) <= 5
    assert set(report["compared"]) == {"cost_target_vs_adaptive"}
    assert set(report["compared"]["cost_target_vs_adaptive"]) == {
        "quality",
        "quality_ci95",
        "tier_cost",
    }
    assert "routing drift" in stderr


def test_drift_policies_must_be_known() -> None:
    command = [*TIERMESH, "bench", "--scenario", "drift", "--drift-policies", "adaptive,nope"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "nope" in run.stdout + run.stderr
