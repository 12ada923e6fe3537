"""The multi-host lab in network namespaces: topology, services, HTTP through the client host.

Hosts (each its own network namespace, prefix hl-): coord (coordinator + air), n1 n2 n3 (agents),
client (herald-lab run), all on a Linux bridge in hl-switch. n3 reaches the bridge through a
user-space L2 relay (relay.py) in hl-relay that adds delay and loss: this kernel has no netem.

    hl-coord  eth0 ── p-coord ┐
    hl-n1     eth0 ── p-n1    │
    hl-n2     eth0 ── p-n2    ├─ br0 (hl-switch)
    hl-client eth0 ── p-client│
    hl-n3     eth0 ── ra (hl-relay: relay.py) rb ── p-n3 ┘

Installed from the .deb (`make test-lab` gives --deb dist/herald-lab_*.deb), as README.md and
agents/README.md deploy a lab: the package is unpacked (dpkg-deb -x) and its binary and units are
what runs; agents/install-coordinator.sh (--stage) makes the lab CA and writes coordinator.env and
air.env for the coord host; the air and the coordinator start exactly as the package's
herald-lab-air and herald-lab-coordinator units start them, and each agent as the package's
herald-lab-agent@.service does (ExecStart with systemd's variable rules and its EnvironmentFile,
agent.env written as agents/install.sh writes it). Only the binary's path differs (the unpacked
/usr/bin/herald-lab), and services run as root here, not as the unit's User=heraldlab. Without
--deb (a --bin of a development build, or NETLAB_PLAIN=1), the air and the coordinator are started
with their flags and agents from agents/herald-lab-agent@.service.
/etc/herald-lab and /var/lib/herald-lab are per host: /etc/netns/hl-nX/herald-lab is bind-mounted
over /etc/herald-lab by `ip netns exec`, and the data folder is bind-mounted inside the agent's
own mount namespace.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PREFIX = "hl-"
SWITCH = PREFIX + "switch"
RELAY = PREFIX + "relay"
HOSTS = {"coord": 1, "n1": 11, "n2": 12, "n3": 13, "client": 20}
AGENTS = ["n1", "n2", "n3"]
RELAYED = "n3"
COORD_PORT, AIR_PORT, AGENT_PORT = 8700, 8702, 8701
STATE_FILE = "/run/heraldlab-netlab.json"
UNIT = os.path.join(REPO, "agents", "herald-lab-agent@.service")
INSTALL = os.path.join(REPO, "agents", "install.sh")
INSTALL_COORDINATOR = os.path.join(REPO, "agents", "install-coordinator.sh")


def ns(host):
    return PREFIX + host


def ipv4(host):
    return f"10.77.0.{HOSTS[host]}"


def ipv6(host):
    return f"fd77::{HOSTS[host]:x}"


def sh(*args, check=True, quiet=False):
    r = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def nsrun(host_ns, *args, check=True):
    return sh("ip", "netns", "exec", host_ns, *args, check=check)


# ---------------------------------------------------------------- systemd unit and install.sh

def unit_exec_start(path=UNIT):
    """ExecStart= of a unit file, continuation lines joined (the last ExecStart= wins)."""
    value, cur = None, None
    for raw in open(path).read().splitlines():
        line = raw if cur is not None else raw.strip()
        if cur is None and (not line or line.startswith(("#", ";"))):
            continue
        cur = (cur or "") + (line[:-1] + " " if line.endswith("\\") else line)
        if line.endswith("\\"):
            continue
        if cur.startswith("ExecStart="):
            value = cur[len("ExecStart="):].strip()
        cur = None
    if not value:
        raise RuntimeError(f"{path}: no ExecStart=")
    return value


def parse_env_file(text):
    """systemd EnvironmentFile=: KEY=VALUE lines, comments, surrounding whitespace and quotes stripped."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            v = v[1:-1]
        env[k.strip()] = v
    return env


def expand_exec(command, env):
    """systemd's command-line rules (systemd.service(5), "Command lines"): the line is split into
    words (quotes respected); a word that is exactly $VAR becomes the value split at whitespace
    (zero or more words); ${VAR} anywhere is replaced by the value as is, within one word."""
    words = shlex.split(command, posix=True)
    exe = words[0].lstrip("-@:+!")
    out = [exe]
    for w in words[1:]:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            out.extend(env.get(m.group(1), "").split())
            continue
        out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), w).replace("$$", "$"))
    return out


def unit_command(unit_path, env_text, instance=None):
    """The command a unit runs: its ExecStart (template instance %i filled in) expanded with its
    EnvironmentFile's text, as systemd does."""
    command = unit_exec_start(unit_path)
    if instance:
        command = command.replace("%i", instance)
    return expand_exec(command, parse_env_file(env_text))


def install_env(**overrides):
    """An agent instance's env file exactly as agents/install.sh writes it: its option defaults,
    then our options (n: the instance, a: its adapter, t: tags, p: port), then its here-document,
    evaluated by bash."""
    text = open(INSTALL).read()
    defaults = re.search(r"^binary=.*$", text, re.M).group(0)
    heredoc = re.search(r'cat > "\$etc/agents/\$n\.env" <<ENV\n(.*?)\nENV\n', text, re.S).group(1)
    assigns = "\n".join(f"{k}={shlex.quote(v)}" for k, v in overrides.items())
    script = f"{defaults}\n{assigns}\ncat <<ENV\n{heredoc}\nENV\n"
    return subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, text=True, check=True).stdout


# ---------------------------------------------------------------- state across crashed runs

def load_state():
    try:
        return json.load(open(STATE_FILE))
    except (OSError, ValueError):
        return {}


def save_state(state):
    with open(STATE_FILE, "w") as f:
        json.dump(state, f)


def clean(log=print):
    """Removes everything a previous run (crashed or not) left: processes in our namespaces, the
    namespaces, /etc/netns/hl-*, mounts and mount points we created."""
    state = load_state()
    names = [l.split()[0] for l in sh("ip", "netns", "list", check=False).splitlines() if l.startswith(PREFIX)]
    for n in names:
        for pid in sh("ip", "netns", "pids", n, check=False).split():
            try:
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for n in names:
        for _ in range(20):
            if not sh("ip", "netns", "pids", n, check=False).split():
                break
            time.sleep(0.1)
        sh("ip", "netns", "del", n, check=False)
    for m in state.get("mounts", []):
        sh("umount", "-l", m, check=False)
    if os.path.isdir("/etc/netns"):
        for n in os.listdir("/etc/netns"):
            if n.startswith(PREFIX):
                shutil.rmtree(os.path.join("/etc/netns", n), ignore_errors=True)
    for d in reversed(state.get("created", [])):
        try:
            os.rmdir(d)
        except OSError:
            pass
    if names or state:
        log(f"netlab: cleaned {len(names)} namespaces and {len(state.get('created', []))} mount points left from before")
    try:
        os.remove(STATE_FILE)
    except OSError:
        pass


def ensure_dir(path, state):
    """Creates a directory (and missing parents) and remembers what it created, to remove it after."""
    missing = []
    p = path
    while not os.path.exists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.mkdir(d)
        state.setdefault("created", []).append(d)
    save_state(state)


# ---------------------------------------------------------------- the topology

def hosts_file():
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    for h in HOSTS:
        lines.append(f"{ipv4(h)} {h}.lab {h}")
    for h in HOSTS:
        lines.append(f"{ipv6(h)} {h}6.lab")
    return "\n".join(lines) + "\n"


def offloads_off(host_ns, dev):
    # A packet socket sees CHECKSUM_PARTIAL frames with an unfinished checksum and 64 KB GSO frames;
    # the relay forwards frames as they are, so every sender computes checksums and segments itself.
    nsrun(host_ns, "ethtool", "-K", dev, "tx", "off", "sg", "off", "tso", "off", "gso", "off", "gro", "off", check=False)


def up(state, extra_hosts=None):
    """Creates the namespaces, the bridge, the links and the hosts files."""
    for h in list(HOSTS) + ["switch", "relay"]:
        sh("ip", "netns", "add", ns(h))
        nsrun(ns(h), "ip", "link", "set", "lo", "up")
    nsrun(SWITCH, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    nsrun(RELAY, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    nsrun(SWITCH, "ip", "link", "add", "name", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0")
    nsrun(SWITCH, "ip", "link", "set", "br0", "up")
    for h in HOSTS:
        if h == RELAYED:
            nsrun(SWITCH, "ip", "link", "add", "name", f"p-{h}", "type", "veth", "peer", "name", "rb", "netns", RELAY)
            nsrun(RELAY, "ip", "link", "add", "name", "ra", "type", "veth", "peer", "name", "eth0", "netns", ns(h))
            for d in ("ra", "rb"):
                nsrun(RELAY, "ip", "link", "set", d, "promisc", "on", "up")
                offloads_off(RELAY, d)
        else:
            nsrun(SWITCH, "ip", "link", "add", "name", f"p-{h}", "type", "veth", "peer", "name", "eth0", "netns", ns(h))
        nsrun(SWITCH, "ip", "link", "set", f"p-{h}", "master", "br0", "up")
        offloads_off(SWITCH, f"p-{h}")
        nsrun(ns(h), "ip", "addr", "add", f"{ipv4(h)}/24", "dev", "eth0")
        nsrun(ns(h), "ip", "-6", "addr", "add", f"{ipv6(h)}/64", "dev", "eth0", "nodad")
        nsrun(ns(h), "ip", "link", "set", "eth0", "up")
        offloads_off(ns(h), "eth0")
    ensure_dir("/etc/netns", state)
    for h in HOSTS:
        d = f"/etc/netns/{ns(h)}"
        os.makedirs(d, exist_ok=True)
        text = hosts_file() + "".join(f"{ip} {name}\n" for name, ip, who in (extra_hosts or []) if h in who)
        open(os.path.join(d, "hosts"), "w").write(text)


def set_hosts_extra(entries):
    """Adds NAME -> IP lines to some hosts' /etc/hosts: entries [(name, ip, [hosts])]."""
    for h in HOSTS:
        text = hosts_file() + "".join(f"{ip} {name}\n" for name, ip, who in entries if h in who)
        open(f"/etc/netns/{ns(h)}/hosts", "w").write(text)


def link(host, state_up):
    """The host's cable: its port on the bridge (or, for the relayed host, the relay's port)."""
    nsrun(SWITCH, "ip", "link", "set", f"p-{host}", "up" if state_up else "down")


# ---------------------------------------------------------------- processes

class Procs:
    """Every process we start, by id; stopped by id."""

    def __init__(self, logs):
        self.logs = logs
        self.procs = {}
        os.makedirs(logs, exist_ok=True)

    def start(self, key, argv, log_name=None):
        logf = open(os.path.join(self.logs, (log_name or key) + ".log"), "a")
        logf.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(shlex.quote(a) for a in argv)}\n")
        logf.flush()
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[key] = p
        return p

    def stop(self, key, sig=signal.SIGTERM, wait=5.0):
        p = self.procs.pop(key, None)
        if p is None or p.poll() is not None:
            return p.returncode if p else None
        try:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return p.wait(wait)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            return p.wait()

    def stop_all(self):
        for k in list(self.procs):
            self.stop(k, wait=3.0)


class Lab:
    """Topology + services; use as a context manager (cleans up on exit, failure or signal)."""

    def __init__(self, out, binary=None, log=print, deb=None):
        self.out = os.path.abspath(out)
        self.deb = os.path.abspath(deb) if deb else None
        self.bin = os.path.abspath(binary) if binary else None
        self.units = None  # the unpacked package's lib/systemd/system, with --deb
        self.log = log
        self.work = os.path.join(self.out, "work")
        self.procs = Procs(os.path.join(self.out, "logs"))
        self.state = {}
        self.token = os.path.join(self.work, "token")
        # As deployed (README, agents/README.md): a lab CA made by `herald-lab ca init`, agents
        # enrolled with their own credentials, TLS everywhere. NETLAB_PLAIN=1: one shared token, HTTP.
        self.secure = os.environ.get("NETLAB_PLAIN") != "1"
        self.cred = os.path.join(self.work, "cred")
        self.enrolled = set()
        self.results = os.path.join(self.work, "coordinator-results")
        self.coord_setting = None  # (results folder, air address, extra flags) of the last start
        self.air = os.environ.get("NETLAB_AIR", f"coord.lab:{AIR_PORT}")
        self.agent_host_ip = os.environ.get("NETLAB_AGENT_HOST_IP") == "1"
        self._token = None
        self.operator = None  # the operator's credentials folder (ca.pem, operator.token), with --deb

    def __enter__(self):
        clean(self.log)
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.work)
        os.makedirs(self.procs.logs)
        self.state = {"created": [], "mounts": [], "out": self.out}
        save_state(self.state)
        up(self.state)
        if self.deb:
            # The package as a node gets it; its binary and units are what runs.
            pkg = os.path.join(self.work, "pkg")
            sh("dpkg-deb", "-x", self.deb, pkg)
            self.bin = os.path.join(pkg, "usr", "bin", "herald-lab")
            self.units = os.path.join(pkg, "lib", "systemd", "system")
            self.log(f"netlab: installed {os.path.basename(self.deb)} ({sh(self.bin, '--version', quiet=True).strip()})")
        if self.secure and self.deb:
            # The coordinator host as agents/README.md sets it up: install-coordinator.sh makes the
            # CA and this host's credentials and writes coordinator.env and air.env (--stage: files
            # only, no apt or systemd); they become the coord host's /etc/herald-lab.
            stage = os.path.join(self.work, "coord-root")
            sh("bash", INSTALL_COORDINATOR, "--stage", stage, "--binary", self.bin, "--host", "coord.lab",
               "--host", "air.lab", "--host", ipv4("coord"), "--host", ipv6("coord"), "--port", str(COORD_PORT),
               "--air-port", str(AIR_PORT), quiet=True)
            etc = f"/etc/netns/{ns('coord')}/herald-lab"
            shutil.copytree(os.path.join(stage, "etc", "herald-lab"), etc)
            self.cred = os.path.join(etc, "coordinator")
            shutil.copy(os.path.join(self.cred, "operator.token"), self.token)
            # The operator's machine (the client host) holds copies of ca.pem and operator.token.
            self.operator = os.path.join(self.work, "operator")
            os.makedirs(self.operator)
            for f in ("ca.pem", "operator.token"):
                shutil.copy(os.path.join(self.cred, f), os.path.join(self.operator, f))
        elif self.secure:
            sh(self.bin, "ca", "init", "--dir", self.cred, "--host", "coord.lab", "--host", "air.lab", "--host", ipv4("coord"), "--host", ipv6("coord"))
            shutil.copy(os.path.join(self.cred, "operator.token"), self.token)
        else:
            open(self.token, "w").write(os.urandom(16).hex() + "\n")
        self._token = open(self.token).read().strip()
        # Mount points for ip netns exec's bind of /etc/netns/NS/herald-lab, and for the data folder.
        ensure_dir("/etc/herald-lab", self.state)
        ensure_dir("/var/lib/herald-lab", self.state)
        return self

    def __exit__(self, *exc):
        self.procs.stop_all()
        self.relay_stop()
        for m in reversed(self.state.get("mounts", [])):
            sh("umount", "-l", m, check=False)
        self.state["mounts"] = []
        save_state(self.state)
        clean(lambda *_: None)
        return False

    # -- relay
    def relay_start(self, delay_ms=20.0, jitter_ms=5.0, loss=0.01, seed=1):
        self.relay_stop()
        self.relay_params = dict(delay_ms=delay_ms, jitter_ms=jitter_ms, loss=loss, seed=seed)
        self.procs.start("relay", ["ip", "netns", "exec", RELAY, "python3", os.path.join(HERE, "relay.py"), "ra", "rb",
                                   "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms), "--loss", str(loss),
                                   "--seed", str(seed), "--stats", os.path.join(self.out, "logs", "relay-stats.json")])
        time.sleep(0.3)

    def relay_stop(self):
        self.procs.stop("relay")

    # -- HTTP from the client host
    def http(self, url, method="GET", body=None, timeout=5, host="client", token=None):
        args = ["ip", "netns", "exec", ns(host), "curl", "-sS", "-m", str(timeout), "-X", method,
                "-H", f"Authorization: Bearer {token or self._token}", "-w", "\n%{http_code}"]
        if self.secure:
            args += ["--cacert", os.path.join(self.cred, "ca.pem")]
        if body is not None:
            args += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        r = subprocess.run(args + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            return None, r.stderr.strip()
        text, _, code = r.stdout.rpartition("\n")
        try:
            return int(code), json.loads(text) if text else None
        except ValueError:
            return int(code), text

    @property
    def scheme(self):
        return "https" if self.secure else "http"

    def auth_flags(self):
        """How a service or command on the lab proves itself."""
        return ["--credentials", self.operator or self.cred] if self.secure else ["--token-file", self.token]

    def coord_url(self, path=""):
        return f"{self.scheme}://coord.lab:{COORD_PORT}{path}"

    def agent_url(self, a, path=""):
        return f"{self.scheme}://{a}.lab:{AGENT_PORT}{path}"

    def wait_http(self, url, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            code, _ = self.http(url, timeout=2)
            if code == 200:
                return True
            time.sleep(0.2)
        return False

    # -- services
    @property
    def from_units(self):
        """The air and the coordinator start as the package's units start them."""
        return self.secure and self.deb is not None

    def unit_argv(self, unit, env_file, instance=None):
        """A packaged unit's ExecStart for the coord host, with its EnvironmentFile (the coord host's
        /etc/herald-lab), as systemd expands it; the binary is the unpacked package's."""
        env_text = open(os.path.join(f"/etc/netns/{ns('coord')}/herald-lab", env_file)).read()
        argv = unit_command(os.path.join(self.units, unit), env_text, instance)
        if argv[0] != "/usr/bin/herald-lab":
            raise RuntimeError(f"{unit}: ExecStart runs {argv[0]}, not the package's /usr/bin/herald-lab")
        argv[0] = self.bin
        return argv, env_text

    def set_env(self, env_file, **values):
        """Edits KEY=VALUE lines of the coord host's env file, as an operator would."""
        path = os.path.join(f"/etc/netns/{ns('coord')}/herald-lab", env_file)
        lines = open(path).read().splitlines()
        for key, value in values.items():
            if not re.fullmatch(r"[A-Za-z0-9_.:\[\] /-]*", value):
                raise ValueError(f"{env_file}: {key}={value!r} is not a plain value")
            lines = [l for l in lines if not l.startswith(key + "=")] + [f"{key}={value}"]
        open(path, "w").write("\n".join(lines) + "\n")

    def start_air(self):
        if self.from_units:
            argv, env_text = self.unit_argv("herald-lab-air.service", "air.env")
            with open(os.path.join(self.out, "logs", "air.cmdline"), "w") as f:
                f.write(env_text + "\n" + " ".join(shlex.quote(x) for x in argv) + "\n")
            self.procs.start("air", ["ip", "netns", "exec", ns("coord"), *argv])
            return
        self.procs.start("air", ["ip", "netns", "exec", ns("coord"), self.bin, "air", "--host", "0.0.0.0", "--port", str(AIR_PORT), *self.auth_flags()])

    def start_coordinator(self, results=None, air=None, extra=()):
        if results is not None or self.coord_setting is None:
            self.coord_setting = (results or self.results, air or self.air, list(extra))
        folder, air_address, more = self.coord_setting
        if self.from_units:
            # coordinator.env as install-coordinator.sh wrote it, with the scenario's air address and
            # extra flags in COORDINATOR_AIR and COORDINATOR_ARGS; the unit's results folder
            # (/var/lib/herald-lab/coordinator) is the scenario's, bound in the coordinator's own
            # mount namespace as the agents' data folders are.
            self.set_env("coordinator.env", COORDINATOR_AIR=air_address, COORDINATOR_ARGS=" ".join(more))
            argv, env_text = self.unit_argv("herald-lab-coordinator.service", "coordinator.env")
            with open(os.path.join(self.out, "logs", "coordinator.cmdline"), "w") as f:
                f.write(env_text + "\n" + " ".join(shlex.quote(x) for x in argv) + "\n")
            os.makedirs(folder, exist_ok=True)
            script = 'mkdir -p /var/lib/herald-lab/coordinator && mount --bind "$0" /var/lib/herald-lab/coordinator && exec "$@"'
            self.procs.start("coordinator", ["ip", "netns", "exec", ns("coord"), "sh", "-c", script, folder, *argv])
        else:
            self.procs.start("coordinator", ["ip", "netns", "exec", ns("coord"), self.bin, "coordinator", "--host", "0.0.0.0", "--port", str(COORD_PORT),
                                              *self.auth_flags(), "--results", folder, "--air", air_address, *more])
        if not self.wait_http(self.coord_url("/health"), 20):
            raise RuntimeError("the coordinator did not answer /health within 20 s (logs/coordinator.log)")

    def agent_argv(self, a):
        """The template unit's ExecStart for instance `a` (herald-lab-agent@a), with its env file
        as install.sh writes it; the binary is ours."""
        d = f"/etc/netns/{ns(a)}/herald-lab"
        os.makedirs(os.path.join(d, "agents"), exist_ok=True)
        if self.secure:
            self.enrol(a, os.path.join(d, "agents", a))
            auth = f"--credentials /etc/herald-lab/agents/{a}"
        else:
            shutil.copy(self.token, os.path.join(d, "token"))
            auth = "--token-file /etc/herald-lab/token"
        opts = dict(n=a, a="hci0", t="none", p=str(AGENT_PORT), coordinator=self.coord_url(), radio="sim", auth=auth)
        if self.agent_host_ip:
            opts["host"] = ipv4(a)
        env_text = install_env(**opts)
        open(os.path.join(d, "agents", f"{a}.env"), "w").write(env_text)
        unit = os.path.join(self.units, "herald-lab-agent@.service") if self.units else UNIT
        argv = unit_command(unit, env_text, a)
        argv[0] = self.bin
        return argv, env_text

    def enrol(self, a, d):
        """`herald-lab agents enrol` from the client host (the coordinator must be up), then
        `herald-lab enrol` into the agent host's /etc/herald-lab, as install.sh does. Once per agent."""
        if a in self.enrolled:
            return
        f = os.path.join(self.work, f"{a}.enrol")
        if os.path.exists(f):
            os.unlink(f)
        if self.from_units:
            # On the coordinator host, with its own credentials folder (agents/README.md, step 5).
            nsrun(ns("coord"), self.bin, "agents", "enrol", a, "--host", f"{a}.lab", "--host", ipv4(a), "--host", ipv6(a),
                  "--out", f, "--coordinator", self.coord_url(), "--credentials", "/etc/herald-lab/coordinator")
        else:
            nsrun(ns("client"), self.bin, "agents", "enrol", a, "--host", f"{a}.lab", "--host", ipv4(a), "--host", ipv6(a),
                  "--out", f, "--coordinator", self.coord_url(), "--credentials", self.cred)
        sh(self.bin, "enrol", f, "--dir", d)
        self.enrolled.add(a)

    def agent_token(self, a):
        """What the coordinator calls agent `a` with (in an enrolled lab, only that agent takes it)."""
        if not self.secure:
            return self._token
        return json.load(open(os.path.join(self.work, f"{a}.enrol")))["credential"]["coordinatorToken"]

    def data_dir(self, a):
        return os.path.join(self.work, f"data-{a}")

    def start_agent(self, a, fresh=False):
        if fresh:
            shutil.rmtree(self.data_dir(a), ignore_errors=True)
        os.makedirs(self.data_dir(a), exist_ok=True)
        argv, env_text = self.agent_argv(a)
        with open(os.path.join(self.out, "logs", f"agent-{a}.cmdline"), "w") as f:
            f.write(env_text + "\n" + " ".join(shlex.quote(x) for x in argv) + "\n")
        # ip netns exec gives the command its own mount namespace: bind the host's data folder over
        # /var/lib/herald-lab there, then become the agent (same pid: signals reach the agent).
        script = f'mkdir -p /var/lib/herald-lab/{a} && mount --bind "$0" /var/lib/herald-lab/{a} && exec "$@"'
        return self.procs.start(a, ["ip", "netns", "exec", ns(a), "sh", "-c", script, self.data_dir(a), *argv], log_name=f"agent-{a}")

    def wait_agents_alive(self, seconds=30, names=AGENTS):
        deadline = time.time() + seconds
        alive = []
        while time.time() < deadline:
            code, body = self.http(self.coord_url("/v1/agents"))
            if code == 200:
                alive = [x["info"]["name"] for x in body if x.get("state") == "alive"]
                if all(n in alive for n in names):
                    return body
            time.sleep(0.3)
        raise RuntimeError(f"agents not alive at the coordinator after {seconds} s (alive: {alive})")

    def start_all(self, fresh=True):
        self.start_air()
        self.start_coordinator()
        for a in AGENTS:
            self.start_agent(a, fresh=fresh)
        return self.wait_agents_alive()

    def stop_services(self):
        for k in ["coordinator", *AGENTS, "air"]:
            self.procs.stop(k)

    # -- runs
    def submit(self, plan, key="client"):
        """Starts `herald-lab run` in the client host; returns (process, log path)."""
        logp = os.path.join(self.out, "logs", f"{key}.log")
        p = self.procs.start(key, ["ip", "netns", "exec", ns("client"), self.bin, "run", plan,
                                   "--coordinator", self.coord_url(), *self.auth_flags(),
                                   "--out", os.path.join(self.out, "bundles")])
        return p, logp

    def run_id(self, logp, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                m = re.search(r"^run (\S+) submitted", open(logp).read(), re.M)
                if m:
                    return m.group(1)
            except OSError:
                pass
            time.sleep(0.2)
        return None

    def record(self, run_id):
        code, body = self.http(self.coord_url(f"/v1/runs/{run_id}"))
        return body if code == 200 else None

    def wait_started(self, run_id, seconds=40):
        """Waits for the run's start instant (coordinator clock = every host's clock here)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            r = self.record(run_id)
            if r and r.get("startAt"):
                return r
            if r and r.get("state") in ("failed", "cancelled"):
                return r
            time.sleep(0.2)
        return None

    def agent_status(self, a, timeout=3):
        code, body = self.http(self.agent_url(a, "/v1/status"), timeout=timeout, token=self.agent_token(a))
        return body if code == 200 else None

    def bundle_dir(self, run_id):
        for d in (os.path.join(self.out, "bundles", run_id), os.path.join(self.results, run_id)):
            if os.path.exists(os.path.join(d, "manifest.json")):
                return d
        return None

    def mount_tmpfs(self, path, size):
        os.makedirs(path, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path)
        self.state["mounts"].append(path)
        save_state(self.state)

    def umount(self, path):
        sh("umount", "-l", path, check=False)
        if path in self.state["mounts"]:
            self.state["mounts"].remove(path)
        save_state(self.state)
