import signal
import sys

from linkescape.testbed.pytest_fixtures import testbed, testbed_factory  # noqa: F401


def _terminate(signum, frame):
    # A killed test run (CI timeout, Ctrl-C from a wrapper) must still tear
    # down the testbeds it made: turn SIGTERM into SystemExit so that fixture
    # finalizers and atexit hooks run.
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _terminate)


#: Tests judged against time bounds (stalls, detection, rates) or that load
#: every core: `make test` runs them alone, after the rest has run in parallel
#: (pytest-xdist), so no other test's CPU shows up in what they measure.
SERIAL = (
    "tests/chaos/test_chaos_regressions.py",  # (the rest of tests/chaos/ judges made-up series, or no time)
    "tests/chaos/test_chaos_soak.py",
    "tests/bench/failover/",
    "tests/engine/test_lossy_rail_integ.py",
    "tests/engine/test_idle_cost_integ.py",
    "tests/integration/test_scale_integ.py",
    "tests/testbed/test_shrink_testbed.py",  # the no-path failure within timeout + 1.5 s, PeerLost within 5 s
    "tests/torchft/test_torchft_training.py",  # a host left out of the quorum within 10 s
)


#: The long runs: `make soak` runs them (CI runs `make test`, then `make soak`), `make test` does
#: not. Fixed-length soaks, long series and benchmark runs (8-320 s each), none the only test of
#: what it exercises: a shorter test in `make test` exercises it too (named beside it).
#: docs/testing.md lists them with their times.
SOAK = (
    "tests/chaos/test_chaos_soak.py::test_chaos_soak_60s",  # short: the chaos replays (tests/chaos/test_chaos_regressions.py)
    # a scripted 20 s chaos run with every report section (18 s, alone); short: the replays, which run the
    # same tool and report
    "tests/chaos/test_chaos_soak.py::test_a_short_scripted_run_reports_everything",
    # a lossy rail degraded then used again (15 s, alone); short: the lossy_primary replay
    "tests/engine/test_lossy_rail_integ.py",
    # 2 x 7 s crosses past a 4 s deadline; short: tests/chaos/test_chaos_regressions.py (relay replays),
    # tests/testbed/test_relay_testbed.py
    "tests/chaos/test_chaos_soak.py::test_crosses_longer_than_the_no_path_deadline",
    # 20k + 6k all_reduces of 4 MiB, and a minute of every operation with its resources sampled (both
    # long series); in make test only tests/bench/test_memory.py's leak finder and tests/engine/'s close tests
    "tests/engine/test_resources_integ.py::test_fresh_4mib_buffers",
    "tests/engine/test_resources_integ.py::test_resources_return_to_warm_levels_and_close_leaves_nothing",
    "tests/integration/test_scale_integ.py",  # the 64-rank job; short: the 4-host testbed tests
    # an idle 16-rank job (5 s) and a 4-rank one (8 s) counted; short: tests/engine/test_timer_rounds.py,
    # tests/engine/test_idle_after_outage_integ.py
    "tests/engine/test_idle_cost_integ.py",
    # DDP training twice (faulty run and reference) on a testbed; short: tests/demo/test_demo.py::test_demo_emulated
    "tests/demo/test_demo.py::test_demo_testbed",
    "tests/demo/test_demo_cross.py",  # a 20 s cross under DDP, twice; short: the same emulated demo
    # the failover benchmark's runs on a testbed (detection and rates judged against their targets: a
    # benchmark's goals); its unit tests stay; short: tests/integration/test_failover_integ.py, the replays
    "tests/bench/failover/test_failover_bench.py::test_small_failover_bench",
    "tests/bench/failover/test_failover_bench.py::test_mptcp_comparison_small",
    "tests/bench/failover/test_failover_bench.py::test_a_flap_series_with_the_jobs_rate_and_carrier_detection",
    "tests/bench/failover/test_failover_rates.py::test_a_cut_keeps_a_4_host_job_at_0_9x_healthy",
    "tests/bench/failover/test_failover_rates.py::test_the_relayed_phase_on_a_4_host_testbed",
    # torchft's own suite twice (its Gloo group, then ours: about 4 minutes) and the 4-replica training
    # through faults (two runs of about 2 minutes); short: tests/torchft/test_process_group.py
    "tests/torchft/test_torchft_suite.py",
    "tests/torchft/test_torchft_training.py",
    # Open MPI beside linkescape and Gloo through mpirun (make soak installs it: make mpi); short: the
    # Python backends' isolated calls in tests/bench/test_scale.py
    "tests/bench/test_mpi.py",
    # builds the wheel and installs it into a fresh venv with pip (about 75 s); short: the torchrun jobs
    # of tests/torch/test_torch_exit.py run the installed entry point
    "tests/test_wheel.py",
    # torchrun's --max-restarts resuming from a checkpoint (27 s); short: tests/torch/test_torch_launch.py
    "tests/torch/test_torch_elastic.py",
    # two of the four torchrun exits (the destroy and the pending-work ones stay in make test)
    "tests/torch/test_torch_exit.py::test_torchrun_without_import[no-destroy]",
    "tests/torch/test_torch_exit.py::test_torchrun_without_import[two-rails]",
    # the memory series (43 s and 22 s); short: ::test_the_tool_finds_a_leak_put_there_on_purpose
    "tests/bench/test_memory.py::test_quick_cases_are_flat_against_their_controls",
    "tests/bench/test_memory.py::test_a_torch_case_runs_its_reference_on_gloo",
)


#: The longest of the others (15 s to 4 minutes each): handed out first, two at a time (the
#: Makefile's --maxschedchunk 1), so that the parallel run does not end with one worker still on
#: one of them.
LONG_FIRST = (
    "tests/engine/test_resources_integ.py::test_fresh_4mib_buffers",
    "tests/torchft/test_torchft_suite.py",
    "tests/torchft/test_torchft_training.py",
    "tests/demo/",
    "tests/torch/test_torch_upstream_suite.py",
    "tests/test_wheel.py",
    "tests/engine/test_resources_integ.py",
    "tests/bench/test_memory.py",
    "tests/faults/test_tool_floors.py",
    "tests/torch/test_torch_elastic.py",
    "tests/testbed/test_metrics_testbed.py",
    "tests/torch/test_torch_ddp",
    "tests/engine/test_protocol_error_integ.py",
    "tests/testbed/test_relay_testbed.py",
    "tests/engine/test_isolated_peer_integ.py",
    "tests/torch/test_torch_collectives.py",
    "tests/integration/test_failover_integ.py",
    "tests/torch/test_torch_shrink.py",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: a long run: `make soak` runs it, `make test` does not (SOAK above)")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        if item.nodeid.startswith(SOAK):
            item.add_marker(pytest.mark.soak)
    items.sort(key=lambda item: next((i for i, p in enumerate(LONG_FIRST) if item.nodeid.startswith(p)),
                                     len(LONG_FIRST)))


def _cpu_now() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_runtest_protocol(item, nextitem):
    """``LINKESCAPE_TEST_CPU=FILE``: one JSON line per test with its wall time and the CPU seconds it
    and the processes it waited for used (to see where `make test`'s time goes); off otherwise."""
    import os

    path = os.environ.get("LINKESCAPE_TEST_CPU")
    if not path:
        return None
    import json
    import time

    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    t0, c0 = time.monotonic(), _cpu_now()
    runtestprotocol(item, nextitem=nextitem)
    with open(path, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "wall": time.monotonic() - t0, "cpu": _cpu_now() - c0}) + "\n")
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
