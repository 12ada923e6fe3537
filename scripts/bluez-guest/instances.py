"""Starts the agent instances agents/install.sh staged (--stage DIR), as systemd would start
herald-lab-agent@NAME from the template unit: the unit's ExecStart with %i, ${VAR} and $VAR
taken from each /etc/herald-lab/agents/NAME.env, the deployed paths mapped into DIR.

    python3 instances.py STAGE BIN LOGDIR [extra agent arguments...]

Runs until SIGTERM or SIGINT, then stops the agents; an agent that exits is started again after
2 s (Restart=on-failure). Each agent's output goes to LOGDIR/NAME.log.
"""
import glob, os, re, shlex, signal, subprocess, sys, time


def exec_start(unit):
    text = open(unit).read().replace('\\\n', ' ')
    for line in text.splitlines():
        if line.startswith('ExecStart='):
            return line[len('ExecStart='):].strip()
    raise SystemExit(f'{unit}: no ExecStart')


def env_file(path):
    env = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        key, _, value = line.partition('=')
        env[key.strip()] = value.strip()
    return env


def command(template, name, env, stage, binary):
    def one(m):  # ${VAR}: one word
        return env.get(m.group(1), '')
    words = []
    for w in shlex.split(template.replace('%i', name)):
        m = re.fullmatch(r'\$([A-Za-z_][A-Za-z0-9_]*)', w)
        if m:  # $VAR: split on white space, as systemd does
            words += env.get(m.group(1), '').split()
        else:
            words.append(re.sub(r'\$\{([A-Za-z_][A-Za-z0-9_]*)\}', one, w))
    words = [w.replace('/etc/herald-lab', f'{stage}/etc/herald-lab').replace('/var/lib/herald-lab', f'{stage}/var/lib/herald-lab') for w in words]
    if words[0] == '/usr/local/bin/herald-lab':
        words[0] = binary
    return words


def main(stage, binary, logs, extra):
    unit = f'{stage}/etc/systemd/system/herald-lab-agent@.service'
    template = exec_start(unit)
    os.makedirs(logs, exist_ok=True)
    agents = {}
    for path in sorted(glob.glob(f'{stage}/etc/herald-lab/agents/*.env')):
        name = os.path.basename(path)[:-4]
        os.makedirs(f'{stage}/var/lib/herald-lab/{name}', exist_ok=True)
        agents[name] = command(template, name, env_file(path), stage, binary) + extra
        print('instance', name, ' '.join(agents[name]), flush=True)
    running = {}
    stopping = []

    def stop(*_):
        stopping.append(True)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        for name, cmd in agents.items():
            p = running.get(name)
            if p is not None and p.poll() is not None and p.exited is None:
                p.exited = time.monotonic()
            if p is None or (p.exited is not None and time.monotonic() - p.exited > 2):
                if p is not None:
                    print(f'instance {name} exited {p.returncode}; starting it again', flush=True)
                log = open(f'{logs}/{name}.log', 'a')
                running[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                running[name].exited = None
        time.sleep(0.2)
    for p in running.values():
        if p.poll() is None:
            p.terminate()
    for p in running.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
