"""The sandbox walkthrough of docs/getting-started.md, run as printed: each command in the
terminal the page gives it, in the page's order, through bash, with the real kubectl and curl.

Commands that run until Ctrl-C (servers, watches) keep their terminal; the test moves on once
they show what the page says they show. The walkthrough's fixed addresses (ports 6443 and
8080, engines on 127.0.0.2 and 127.0.0.3, /tmp/snooze-kubeconfig) would clash with another run
on the same machine, so where it can the test runs every terminal in a network and mount
namespace of its own (its own loopback, its own /tmp); elsewhere it checks they are free, gives
the terminals a temporary folder of the test's own (`mktemp -d` makes its kubectl cache there)
and removes the kubeconfig the walkthrough wrote, so that nothing is left in /tmp.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ports import printed_addresses
from waits import wait_for

pytestmark = pytest.mark.needs("kubectl", "curl", "bash")

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/getting-started.md"
SECTION = "## The sandbox walkthrough"
WATCH_SAMPLE = "Terminal 6, with the lines in between left out:"
KUBECONFIG = Path("/tmp/snooze-kubeconfig")
"""Where the walkthrough's sandbox writes its kubeconfig."""


@dataclass(frozen=True)
class Step:
    terminal: int
    command: str
    forever: bool = False
    """Runs until Ctrl-C (a server, a watch): the test goes on once `shows` appears."""
    shows: tuple[str, ...] = ()
    """Regular expressions its output must match (a finished command: its whole output)."""


WAKE = (
    "curl -si localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    """  -d '{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'"""
)
ASK = WAKE.replace("curl -si", "curl -s")
WAIT = "kubectl wait im/chat --for=jsonpath='{.status.phase}'=%s --timeout=%s"
MET = r"inferencemodel.snooze.dev/chat condition met"
BOTH = r"chat-0 +1/1 +Running +0 +\S+ +%s\s+chat-1 +1/1 +Running +0 +\S+ +%s\s"

# The walkthrough, as the page prints it (test_the_page_prints_these_steps keeps them equal).
STEPS = [
    Step(
        1,
        "snooze sandbox --port 6443 --kubeconfig /tmp/snooze-kubeconfig",
        forever=True,
        shows=(r"serving http://127\.0\.0\.1:6443; kubeconfig written to /tmp/snooze-kubeconfig",),
    ),
    Step(
        2,
        "snooze operator --kubeconfig /tmp/snooze-kubeconfig --probe-interval 2",
        forever=True,
        shows=(
            r"InferenceModels and GPUPools are served once their CRDs are installed "
            r"\(kubectl apply -f crds/\)",
        ),
    ),
    Step(
        3,
        "snooze sim --host 127.0.0.2 --count 2 --port 8000 --model chat",
        forever=True,
        shows=(r"127\.0\.0\.2:8000", r"127\.0\.0\.3:8000"),
    ),
    Step(
        4,
        "snooze gateway --kubeconfig /tmp/snooze-kubeconfig --port 8080",
        forever=True,
        shows=(
            r"gateway listening on 0\.0\.0\.0:8080",
            r"InferenceModels are served once their CRD is installed \(kubectl apply -f crds/\)",
        ),
    ),
    Step(5, "export KUBECONFIG=/tmp/snooze-kubeconfig KUBECACHEDIR=$(mktemp -d)"),
    Step(
        5,
        "kubectl apply -f crds/",
        shows=(
            r"customresourcedefinition.apiextensions.k8s.io/inferencemodels.snooze.dev created",
        ),
    ),
    Step(
        5,
        "kubectl apply -f examples/sandbox/pods.yaml",
        shows=(r"pod/chat-0 created", r"pod/chat-1 created"),
    ),
    Step(
        5,
        "kubectl apply -f examples/sandbox/chat.yaml",
        shows=(r"inferencemodel.snooze.dev/chat created",),
    ),
    Step(5, WAIT % ("Awake", "2m"), shows=(MET,)),
    Step(
        6,
        "kubectl get im -w --kubeconfig /tmp/snooze-kubeconfig",
        forever=True,
        shows=(r"NAME +MODEL +PHASE +AWAKE +ASLEEP +LAST WAKE +AGE", r"chat +chat +Awake +2 +0 "),
    ),
    Step(5, ASK, shows=(r'"object": ?"chat.completion"', r'"model": ?"chat"')),
    # A minute idle (examples/sandbox/chat.yaml), the first sleep's record and its 5.7 s.
    Step(5, WAIT % ("Asleep", "3m"), shows=(MET,)),
    Step(
        5,
        "kubectl get pods -L snooze.dev/state",
        shows=(r"NAME +READY +STATUS +RESTARTS +AGE +STATE", BOTH % ("asleep", "asleep")),
    ),
    Step(
        5,
        WAKE,
        shows=(r"HTTP/1.1 200", r"(?i)x-snooze-held-seconds: \d", r'"object": ?"chat.completion"'),
    ),
    Step(
        5,
        "kubectl wait im/chat --for=jsonpath='{.status.awake}'=2 --timeout=1m",
        shows=(MET,),
    ),
    Step(5, "kubectl get pods -L snooze.dev/state", shows=(BOTH % ("awake", "awake"),)),
    Step(
        5,
        "kubectl events --for im/chat",
        shows=(
            *(
                rf"{reason}\s+InferenceModel/chat\s.*chat-{n}"
                for n in (0, 1)
                for reason in ("Draining", "Slept", "Waking", "Woke")
            ),
        ),
    ),
    Step(
        5,
        "kubectl describe im chat",
        shows=(r"Name: +chat", r"Phase: +Awake", r"Type: +Ready", r"Type: +Awake"),
    ),
]


def page_steps(page: str) -> list[tuple[int, str]]:
    """The walkthrough's first code block: `# N. ...` names the terminal of what follows; a
    line ending in a backslash goes on."""
    section = page[page.index(SECTION) :]
    block = section[section.index("```sh\n") + len("```sh\n") :]
    block = block[: block.index("\n```")]
    steps: list[tuple[int, str]] = []
    terminal = 0
    pending = ""
    for line in block.splitlines():
        if pending:
            pending += "\n" + line
        elif header := re.match(r"# (\d+)\. ", line):
            terminal = int(header.group(1))
            continue
        elif not line.strip() or line.startswith("#"):
            continue
        else:
            pending = line
        if not pending.endswith("\\"):
            assert terminal, f"{pending!r} comes before any `# N.` terminal header"
            steps.append((terminal, pending))
            pending = ""
    return steps


def watch_sample(page: str) -> list[tuple[str, str, str]]:
    """PHASE, AWAKE and ASLEEP of each line the page shows terminal 6 print."""
    section = page[page.index(WATCH_SAMPLE) :]
    block = section[section.index("```\n") + 4 :]
    rows = block[: block.index("\n```")].splitlines()[1:]
    return [(row.split()[2], row.split()[3], row.split()[4]) for row in rows]


def test_the_page_prints_these_steps() -> None:
    page = (ROOT / PAGE).read_text()
    assert page_steps(page) == [(s.terminal, s.command) for s in STEPS], (
        "the walkthrough and this test's STEPS differ: change both together"
    )
    phases = [phase for phase, _, _ in watch_sample(page)]
    assert phases == ["Awake", "Asleep", "Awake"]


def _interruptible() -> None:
    # As in a terminal: Ctrl-C and Ctrl-\ do what they do by default. Started from a shell
    # in the background (`pytest ... &`), this process ignores both and its children would
    # inherit that, and a shell cannot undo an ignore it was started with: `snooze sim`,
    # which leaves SIGINT to Python, then never saw Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Machine:
    """Where the terminals run: a network and mount namespace of their own (a loopback and a
    /tmp of their own) when unshare allows it, else this machine as it is."""

    def __init__(self, tmp: Path) -> None:
        self.holder: subprocess.Popen[str] | None = None
        self.prefix: list[str] = []
        self.home = tmp / "home"
        self.tmp = tmp / "tmp"
        """The terminals' TMPDIR when they share this machine's /tmp."""
        self.writes_kubeconfig = False
        """The walkthrough's kubeconfig is this run's to remove (none was there before)."""
        self.turn = contextlib.ExitStack()
        """This run's turn at the printed addresses, when it shares this machine's."""
        if str(ROOT).startswith("/tmp/") or not all(
            shutil.which(p) for p in ("unshare", "nsenter", "ip")
        ):
            return
        as_user = [] if os.geteuid() == 0 else ["--map-root-user"]
        holder = subprocess.Popen(
            [
                *("unshare", *as_user, "--net", "--mount", "--propagation", "private", "sh"),
                "-c",
                "ip link set lo up && mount -t tmpfs tmpfs /tmp && echo ready && exec sleep 1d",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":  # not allowed here: EOF
            holder.wait()
            return
        self.holder = holder
        self.prefix = [
            *("nsenter", f"--target={holder.pid}", "--net", "--mount"),
            *(["--user", "--preserve-credentials"] if as_user else []),
            f"--wd={ROOT}",
        ]
        self.home = Path("/tmp/home")

    def outside(self, path: Path) -> Path:
        """A path of the terminals' file system, as this process reaches it."""
        return Path(f"/proc/{self.holder.pid}/root{path}") if self.holder else path

    def check_free(self) -> None:
        if self.holder:
            return
        self.turn.enter_context(printed_addresses())  # another run's walkthrough or demo
        if KUBECONFIG.exists():
            pytest.fail(f"{KUBECONFIG} exists: the walkthrough would overwrite it; move it")
        self.writes_kubeconfig = True
        for host, port in (("127.0.0.1", 6443), ("0.0.0.0", 8080), *self.engines()):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1" if host == "0.0.0.0" else host, port)) == 0:
                    pytest.fail(f"{host}:{port} is taken: the walkthrough needs it; stop it")

    @staticmethod
    def engines() -> list[tuple[str, int]]:
        return [("127.0.0.2", 8000), ("127.0.0.3", 8000)]

    def env(self) -> dict[str, str]:
        """What the terminals' environment needs beyond a new user's."""
        if self.holder:
            return {}
        self.tmp.mkdir(exist_ok=True)
        return {"TMPDIR": str(self.tmp)}

    def close(self) -> None:
        if self.holder:
            self.holder.kill()
            self.holder.wait()
        elif self.writes_kubeconfig:
            KUBECONFIG.unlink(missing_ok=True)
        self.turn.close()


class Terminal:
    """A bash that runs the commands it is sent one after the other, as a person's terminal
    does; everything it prints goes to its log."""

    def __init__(self, number: int, machine: Machine, env: dict[str, str], log: Path) -> None:
        self.number = number
        self.log = log
        self.steps = 0
        read, self._write = os.pipe()
        with log.open("wb") as out:
            self.shell = subprocess.Popen(
                [*machine.prefix, "bash", "--noprofile", "--norc", f"/dev/fd/{read}"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                pass_fds=(read,),
                start_new_session=True,
                preexec_fn=_interruptible,
            )
        os.close(read)

    def output(self, since: int = 0) -> str:
        return self.log.read_bytes()[since:].decode(errors="replace")

    def start(self, command: str) -> int:
        """Send `command`; the log's size before it, to read what it prints."""
        since = self.log.stat().st_size
        os.write(self._write, (command + "\n").encode())
        return since

    def run(self, command: str, timeout: float) -> tuple[int, str]:
        """Run `command` to its end: its exit status and what it printed."""
        self.steps += 1
        marker = f"@@ step {self.steps} exit "
        since = self.start(f"{command}\nprintf '\\n{marker}%s @@\\n' $?")
        pattern = re.compile(re.escape(marker) + r"(\d+) @@")
        found = wait_for(
            f"`{command}` in terminal {self.number} to end",
            lambda: pattern.search(self.output(since)),
            timeout=timeout,
        )
        return int(found.group(1)), self.output(since)[: found.start()]

    def wait_to_show(self, pattern: str, since: int, timeout: float) -> None:
        """Until what it printed since `since` matches `pattern` (or its bash ended)."""
        wait_for(
            f"terminal {self.number} to show {pattern!r}",
            lambda: re.search(pattern, self.output(since)) or self.shell.poll() is not None,
            timeout=timeout,
        )

    def interrupt(self) -> None:
        """Ctrl-C, then the end of input: the terminal's command and its bash end."""
        if self.shell.poll() is None:
            os.killpg(self.shell.pid, signal.SIGINT)
        os.close(self._write)

    def wait(self, timeout: float) -> bool:
        try:
            self.shell.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(self.shell.pid, signal.SIGKILL)
            self.shell.wait()
            return False


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    machine = Machine(tmp_path)
    yield machine
    machine.close()


class Session:
    """The terminals of one walkthrough: each a new user's shell (the venv activated, its
    `snooze` running this interpreter, no kubeconfig of their own, an empty home), its output
    logged."""

    def __init__(self, machine: Machine, tmp_path: Path) -> None:
        self.machine, self.tmp_path = machine, tmp_path
        home = machine.outside(machine.home)
        (home / "bin").mkdir(parents=True)
        snooze = home / "bin" / "snooze"
        snooze.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m snooze.cli "$@"\n')
        snooze.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env |= {"HOME": str(machine.home), "PATH": f"{machine.home}/bin:{os.environ['PATH']}"}
        self.env = env | machine.env()
        self.terminals: dict[int, Terminal] = {}

    def terminal(self, number: int) -> Terminal:
        if number not in self.terminals:
            log = self.tmp_path / f"terminal-{number}.log"
            self.terminals[number] = Terminal(number, self.machine, self.env, log)
        return self.terminals[number]

    def logs(self) -> str:
        return "".join(
            f"\n--- terminal {n} ---\n{t.output()[-3000:]}"
            for n, t in sorted(self.terminals.items())
        )

    def run(self, steps: list[Step]) -> None:
        """Each step in its terminal: a server until it shows what it must, a command to its
        end, what it printed matching what it must show."""
        for step in steps:
            shell = self.terminal(step.terminal)
            if step.forever:
                since = shell.start(step.command)
                for shows in step.shows:
                    shell.wait_to_show(shows, since, timeout=90)
                    assert shell.shell.poll() is None, f"`{step.command}` ended{self.logs()}"
                continue
            status, printed = shell.run(step.command, timeout=180)
            assert status == 0, f"`{step.command}` failed ({status}):\n{printed}{self.logs()}"
            for shows in step.shows:
                assert re.search(shows, printed), (
                    f"`{step.command}` printed:\n{printed}{self.logs()}"
                )

    def stop(self) -> None:
        """Ctrl-C in each terminal: every one stops, none printed a traceback."""
        for shell in self.terminals.values():
            shell.interrupt()
        stopped = {n: shell.wait(30) for n, shell in self.terminals.items()}
        assert all(stopped.values()), f"Ctrl-C did not stop terminals {stopped}{self.logs()}"
        assert not [n for n, t in self.terminals.items() if "Traceback" in t.output()], self.logs()


def test_the_walkthrough_runs_as_printed(machine: Machine, tmp_path: Path) -> None:
    page = (ROOT / PAGE).read_text()
    machine.check_free()
    steps = page_steps(page)
    assert steps == [(s.terminal, s.command) for s in STEPS]
    session = Session(machine, tmp_path)
    terminal, logs = session.terminal, session.logs
    try:
        session.run(STEPS)
        # Terminal 6 showed the model change as the page shows it (other lines between).
        seen = [
            (row.split()[2], row.split()[3], row.split()[4])
            for row in terminal(6).output().splitlines()
            if row.startswith("chat ")
        ]
        remaining = iter(seen)
        assert all(line in remaining for line in watch_sample(page)), seen
        # Terminals 2 and 4 saw the CRD come; the gateway, sandbox and engines warned of nothing.
        assert "the InferenceModel CRD is installed" in terminal(4).output()
        for quiet in (1, 3, 4):
            said = terminal(quiet).output()
            assert not re.search(r" (WARNING|ERROR) ", said), f"terminal {quiet}:\n{said}"
        # Terminal 2 said each step of both pods.
        operator = terminal(2).output()
        assert "a CRD is installed: restarting kopf's watches" in operator
        # It waited for its CRDs and said so: kopf's own warning that they "cannot be served"
        # would contradict it.
        assert "Unresolved resources" not in operator, operator
        for pod in ("chat-0", "chat-1"):
            for said in (
                "Draining: {}: idle",
                "Slept: {}: asleep",
                "Waking: {}:",
                "Woke: {}: awake",
            ):
                assert said.format(pod) in operator, f"{said.format(pod)}{logs()}"
    finally:
        session.stop()
