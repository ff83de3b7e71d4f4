#!/usr/bin/env python3
"""Runs the workspace's test executables several at a time (test.sh's test step).

`cargo test --workspace` runs its test executables one after another; an
integration test binary is a world (tests/<world>/main.rs) whose modules each
boot their own control plane and mostly wait on it, so running a few at once
shortens the step to about the longest module plus a share of the rest. This
script takes the executables cargo built (`cargo test --workspace --no-run
--message-format=json-render-diagnostics`, its stdout in ARTIFACTS) and runs
them as cargo would (cwd the package's directory, cargo's CARGO_* variables
set): a unit-test executable as one job, a world's binary as one job per
module (`<binary> --exact <the module's tests>`, named after the module), at
most JOBS at once, the longest first; the modules named in ALONE run
afterwards, one at a time, with nothing else running (they measure rates or
latencies that a shared CPU skews). Each job's output goes to
LOG_DIR/<package>.<kind>.<name>.log; one line is printed per job as it ends,
a table at the end.

Each executable gets CSI_SIDECAR_CLUSTER_DIR=<that directory>/<its name>
when the variable is set, so the control-plane run directories it leaves are
its own. When one fails: the last lines of those run directories' component
logs, then each failing executable's "failures:" section (its failed tests'
output), then the failed tests' names, last (CI shows the end).

The skew suite (SKEW_SUITE: the test modules of the API surface that
changed between Kubernetes minors) also runs at each --skew VERSION, in the
same pool: those jobs get CSI_SIDECAR_KUBE_VERSION=VERSION (the components
must be built for it: build-components.sh) and are named NAME@VERSION.
Modules in EXCLUSIVE never run two at a time (whatever their version).

Usage: run-tests.py [--jobs N] [--log-dir DIR] [--skew VERSION]... [--skew-only]
                    ARTIFACTS [NAME...]
  NAME...      run only these (a test module's name, or NAME (lib), NAME (bin))
  --skew V     also run SKEW_SUITE at Kubernetes V (a module in
               integration/go/kube-versions/, or "default"); repeatable
  --skew-only  only the --skew jobs
Environment: CSI_SIDECAR_TEST_JOBS (default 3) when --jobs is not given.
Standard library only.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# Seconds each integration test module took when run alone (test.sh, cargo
# test one after another, 2 cores): the longest start first. Modules not
# listed count as short and start after these.
KNOWN_SECONDS = {
    "churn_soak": 148,
    "attacher_faults": 92,
    "rbac": 75,
    "budget": 47,
    "attacher_fairness": 35,
    "resizer_faults": 33,
    "provisioner_faults": 31,
    "snapshotter_faults": 28,
    "manifests": 26,
    "combined": 17,
    "leader_election": 15,
    "cluster": 15,
    "dropin_runtime": 15,
    "explain": 10,
    "monitoring_scrape": 10,
    "real_node": 155,
}

# The API surface that changed between Kubernetes minors: provisioning with
# topology and data sources, attach/detach, expansion and
# VolumeAttributesClass modify, snapshots and group snapshots, capacity,
# registration with a kubelet, streaming lists vs LIST, leader election; the
# real node and its chart (dropped at a version without a kubelet); volume
# health (PersistentVolumeClaim.status.healthStatus from 1.37, events before:
# the feature the oldest version lacks, detected and switched off).
SKEW_SUITE = (
    "provisioner", "provisioner_sources", "provisioner_vac", "attacher", "resizer", "snapshotter",
    "group_snapshots", "capacity", "lists", "leader_election", "node_workflow", "kubelet_registration",
    "real_node", "health_monitor",
)

# Test modules that never run two at a time: a real node (containerd and a
# kubelet) is one per host.
EXCLUSIVE = ("real_node",)

# Test modules whose assertions are about time or rate as the apiserver sees
# it, run with nothing beside them once the others are done:
#   budget: the provisioner's request rate, sampled every 200 ms from the
#           apiserver's metrics; a scrape that a busy CPU delays shifts a
#           sample and turns the bucket's allowance into a false excess.
ALONE = ("budget",)

RESULT = re.compile(
    r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out"
)


class Job:
    def __init__(self, name, kind, package, argv, cwd, env, log, slug, version=None):
        self.name, self.kind, self.package, self.slug, self.version = name, kind, package, slug, version
        self.argv, self.cwd, self.env, self.log = argv, cwd, env, log
        self.proc = None
        self.started = self.seconds = 0.0
        self.code = None
        self.counts = (0, 0, 0)  # passed, failed, ignored
        self.results = 0  # "test result:" lines seen

    @property
    def label(self):
        label = self.name if self.kind in ("test", "doc") else f"{self.name} ({self.kind})"
        return f"{label}@{self.version}" if self.version else label

    @property
    def ok(self):
        return self.code == 0

    def estimate(self):
        return KNOWN_SECONDS.get(self.name, 5) if self.kind == "test" else 1

    def start(self):
        self.out = open(self.log, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=self.out, stderr=subprocess.STDOUT
        )

    def poll(self):
        code = self.proc.poll()
        if code is None:
            return False
        self.code = code
        self.seconds = time.monotonic() - self.started
        self.out.close()
        passed = failed = ignored = 0
        for line in read_lines(self.log):
            m = RESULT.match(line)
            if m:
                self.results += 1
                passed, failed, ignored = passed + int(m[2]), failed + int(m[3]), ignored + int(m[4])
        self.counts = (passed, failed, ignored)
        return True

    def outcome(self):
        if self.ok:
            return "ok"
        return "FAILED" if self.code > 0 else f"KILLED (signal {-self.code})"

    def counts_text(self):
        p, f, i = self.counts
        text = f"{p} passed, {f} failed" + (f", {i} ignored" if i else "")
        return text if self.results else f"no test result (exit code {self.code})"


def read_lines(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace").splitlines()


def cargo_env(package):
    """The variables cargo sets when it runs a package's test executable."""
    version = package["version"]
    core, _, pre = version.partition("-")
    major, minor, patch = (core.split(".") + ["0", "0"])[:3]
    manifest = package["manifest_path"]
    readme = package.get("readme") or ""
    return {
        "CARGO": os.environ.get("CARGO") or shutil.which("cargo") or "cargo",
        "CARGO_MANIFEST_DIR": os.path.dirname(manifest),
        "CARGO_MANIFEST_PATH": manifest,
        "CARGO_PKG_NAME": package["name"],
        "CARGO_PKG_VERSION": version,
        "CARGO_PKG_VERSION_MAJOR": major,
        "CARGO_PKG_VERSION_MINOR": minor,
        "CARGO_PKG_VERSION_PATCH": patch.split("+")[0],
        "CARGO_PKG_VERSION_PRE": pre.split("+")[0],
        "CARGO_PKG_AUTHORS": ":".join(package.get("authors") or []),
        "CARGO_PKG_DESCRIPTION": package.get("description") or "",
        "CARGO_PKG_HOMEPAGE": package.get("homepage") or "",
        "CARGO_PKG_REPOSITORY": package.get("repository") or "",
        "CARGO_PKG_LICENSE": package.get("license") or "",
        "CARGO_PKG_LICENSE_FILE": package.get("license_file") or "",
        "CARGO_PKG_RUST_VERSION": package.get("rust_version") or "",
        "CARGO_PKG_README": readme,
    }


def has_kubelet(version):
    """Whether the module of `version` builds a kubelet (kube-version-module.sh)."""
    if version == "default":
        return True
    gomod = Path("integration/go/kube-versions") / version / "go.mod"
    return gomod.is_file() and "k8s.io/kubernetes/cmd/kubelet\n" in gomod.read_text()


def at_version(job, version, log_dir, cluster_dir):
    """A copy of `job` that runs against Kubernetes `version`."""
    env = dict(job.env)
    env.pop("CSI_SIDECAR_KUBE_VERSION", None)
    if version != "default":
        env["CSI_SIDECAR_KUBE_VERSION"] = version
    slug = f"{job.slug}@{version}"
    if cluster_dir:
        env["CSI_SIDECAR_CLUSTER_DIR"] = os.path.join(cluster_dir, slug)
    return Job(job.name, job.kind, job.package, job.argv, job.cwd, env, log_dir / f"{slug}.log", slug, version)


def skew_jobs(jobs, versions, log_dir, cluster_dir):
    suite = [j for j in jobs if j.kind == "test" and j.name in SKEW_SUITE]
    missing = set(SKEW_SUITE) - {j.name for j in suite}
    if missing:
        raise SystemExit(f"run-tests: the skew suite names test modules that were not built: {sorted(missing)}")
    return [
        at_version(j, v, log_dir, cluster_dir)
        for v in versions
        for j in suite
        if j.name != "real_node" or has_kubelet(v)
    ]


def module_tests(exe, cwd, env):
    """The tests of a world's binary by module (the first segment of each
    test's path), in the binary's order."""
    listing = subprocess.run(
        [exe, "--list", "--format", "terse"], cwd=cwd, env=env, check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    modules = {}
    for line in listing.splitlines():
        test, sep, what = line.rpartition(": ")
        if not sep or what != "test":
            continue
        module = test.split("::", 1)[0] if "::" in test else os.path.basename(exe).rsplit("-", 1)[0]
        modules.setdefault(module, []).append(test)
    return modules


def load_jobs(artifacts, log_dir, cluster_dir):
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1"], check=True, stdout=subprocess.PIPE
        ).stdout
    )
    packages = {p["id"]: p for p in meta["packages"]}
    jobs, seen = [], set()
    for line in read_lines(artifacts):
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable") or not msg["profile"]["test"]:
            continue
        kind = msg["target"]["kind"][0]
        if kind not in ("lib", "bin", "test", "proc-macro"):
            continue
        package = packages[msg["package_id"]]
        name = msg["target"]["name"]
        if (package["name"], kind, name) in seen:
            continue
        seen.add((package["name"], kind, name))
        base = dict(os.environ)
        base.update(cargo_env(package))
        exe, cwd = msg["executable"], base["CARGO_MANIFEST_DIR"]
        # An integration test target is a world (tests/<world>/main.rs) of
        # modules: each module runs in a process of its own, as a job named
        # after it.
        parts = module_tests(exe, cwd, base) if kind == "test" else {name: None}
        for part, tests in parts.items():
            env = dict(base)
            slug = f"{package['name']}.{kind}.{part}"
            if cluster_dir:
                env["CSI_SIDECAR_CLUSTER_DIR"] = os.path.join(cluster_dir, slug)
            argv = [exe] if tests is None else [exe, "--exact", *tests]
            jobs.append(Job(part, kind, package["name"], argv, cwd, env, log_dir / f"{slug}.log", slug))
    # The doc tests: cargo builds and runs them in one go (`--no-run` does not
    # build them).
    argv = ["cargo", "test", "--workspace", "--doc"]
    env = dict(os.environ)
    jobs.append(Job("doc-tests", "doc", "workspace", argv, os.getcwd(), env, log_dir / "doc-tests.log", "doc-tests"))
    return jobs


def line_for(job, done, total):
    return f"[{done:>2}/{total}] {job.outcome():<7} {job.label:<34} {job.seconds:6.1f} s  {job.counts_text()}"


def run(jobs, parallel):
    """Runs `jobs` with at most `parallel` at once, longest first, then the
    ALONE ones by themselves; returns the wall time."""
    started = time.monotonic()
    alone = [j for j in jobs if j.kind == "test" and j.name in ALONE]
    queue = sorted((j for j in jobs if j not in alone), key=lambda j: -j.estimate())
    total, done, running = len(jobs), 0, []
    while queue or running or alone:
        while len(running) < parallel:
            busy = {j.name for j in running if j.name in EXCLUSIVE}
            job = next((j for j in queue if j.name not in busy), None)
            if job is None:
                break
            queue.remove(job)
            job.start()
            running.append(job)
        if not queue and not running and alone:
            job = alone.pop(0)
            print(f"        (alone) {job.label}", flush=True)
            job.start()
            running.append(job)
        time.sleep(0.2)
        for job in [j for j in running if j.poll()]:
            running.remove(job)
            done += 1
            print(line_for(job, done, total), flush=True)
    return time.monotonic() - started


def summary(jobs, wall, parallel):
    print("\n===== test executables (longest first) =====")
    print(f"{'executable':<34} {'result':<7} {'seconds':>8}  tests")
    for job in sorted(jobs, key=lambda j: -j.seconds):
        print(f"{job.label:<34} {job.outcome():<7} {job.seconds:8.1f}  {job.counts_text()}")
    serial = sum(j.seconds for j in jobs)
    print(f"{len(jobs)} executables in {wall:.1f} s with {parallel} at once ({serial:.1f} s of their run times added up)")


def failure_report(failed, cluster_dir, root):
    for job in failed:
        runs = Path(cluster_dir) / job.slug if cluster_dir else None
        run_dirs = sorted(d for d in runs.iterdir() if d.is_dir()) if runs and runs.is_dir() else []
        # The runs a panicking test marked, else all of them.
        for run_dir in [d for d in run_dirs if (d / "FAILED").exists()] or run_dirs:
            print(f"\n----- control-plane run {run_dir} ({job.label}) -----", file=sys.stderr)
            # The components', then a real node's containers' (logs/pods/).
            for log in sorted((run_dir / "logs").glob("*.log")) + sorted((run_dir / "logs").glob("pods/*/*/*.log")):
                print(f"--- {log} (last 30 lines)", file=sys.stderr)
                print("\n".join(read_lines(log)[-30:]), file=sys.stderr)
    for job in failed:
        log = os.path.relpath(job.log, root)
        print(f"\n===== {job.label}: {job.outcome()} (its output: {log}) =====", file=sys.stderr)
        lines, section, on = read_lines(job.log), [], False
        # The "failures:" section of each test binary: the failed tests'
        # output, then their names.
        for line in lines:
            if line == "failures:":
                on = True
            if on:
                section.append(line)
            if line.startswith("test result:"):
                on = False
        print("\n".join((section or lines)[-400:]), file=sys.stderr)
    failed_test = re.compile(r"^test .* \.\.\. FAILED$")
    names = [f"{job.label}: {line}" for job in failed for line in read_lines(job.log) if failed_test.match(line)]
    names += [f"{job.label}: {job.outcome()}, {job.counts_text()}" for job in failed]
    print("\n" + "\n".join(names), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("CSI_SIDECAR_TEST_JOBS") or 3))
    ap.add_argument("--log-dir", default="target/test-logs")
    ap.add_argument("--skew", action="append", default=[], metavar="VERSION")
    ap.add_argument("--skew-only", action="store_true")
    ap.add_argument("artifacts")
    ap.add_argument("only", nargs="*")
    args = ap.parse_args()
    # One stream in order when both go to one log (CI): the failure report
    # (stderr) comes after the table (stdout).
    sys.stdout.reconfigure(line_buffering=True)
    root = os.getcwd()
    log_dir = Path(args.log_dir).resolve()
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    cluster_dir = os.environ.get("CSI_SIDECAR_CLUSTER_DIR") or ""
    jobs = load_jobs(args.artifacts, log_dir, cluster_dir)
    skewed = skew_jobs(jobs, args.skew, log_dir, cluster_dir)
    if args.skew_only:
        jobs = []
    if args.only:
        jobs = [j for j in jobs if j.label in args.only or j.name in args.only]
    jobs += skewed
    if not jobs:
        print("run-tests: no test executables", file=sys.stderr)
        return 1
    parallel = max(1, args.jobs)
    print(f"run-tests: {len(jobs)} test executables, {parallel} at once; output in {os.path.relpath(log_dir, root)}/")
    # SIGTERM (CI's timeout, a parent going away) stops the executables too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        wall = run(jobs, parallel)
    finally:
        for job in jobs:
            if job.proc is not None and job.proc.poll() is None:
                job.proc.kill()
    summary(jobs, wall, parallel)
    failed = [j for j in jobs if not j.ok]
    passed, failures, ignored = (sum(j.counts[i] for j in jobs) for i in range(3))
    failures += sum(1 for j in failed if j.counts[1] == 0)  # a crash, or no test result at all
    # The closing line CI reads.
    print(f"tests: {passed} passed, {failures} failed, {ignored} skipped", flush=True)
    if failed:
        failure_report(failed, cluster_dir, root)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
