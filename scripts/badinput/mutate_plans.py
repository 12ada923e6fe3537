"""Seeded mutations of the shipped plans (plans/*.yaml) for the bad-input suite."""
import os
import re

HUGE = ["1e308", "-1e308", "1e400", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
        "18446744073709551616", "10000000000000000000", "nan", "NaN", ".nan", "inf", "-inf", ".inf", "-.inf",
        "infinity", "-0", "0", "-1", "1e-300", "4.9e-324", "0x7fffffff", "1_000", "99999999999999999999999"]
UNITS = ["", "s", "ms", "m", "h", "d", "cm", " s"]
WRONG = ["[1, 2]", "{a: 1}", "\"text\"", "true", "null", "~", "[]", "{}", "''", "!!binary aGVsbG8=", "2026-01-01"]
DATES = ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2022-02-31T00:00:00Z", "2026-01-01T25:61:00Z",
         "1969-12-31T23:59:59Z", "99999-01-01T00:00:00Z", "2026-13-01T00:00:00Z"]
NUMBER = re.compile(rb"(?<![A-Za-z_])-?\d+(?:\.\d+)?")


def alias_bomb(rng):
    depth = rng.randint(8, 12)
    lines = ["name: bomb", "duration: 1m", "nodes: [a, b]", "description: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, depth):
        lines.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    field = rng.choice(["tags_probe", "sensor", "nodes"])
    if field == "sensor":
        lines.append(f"sensor: *a{depth - 1}")
    elif field == "nodes":
        lines[2] = "nodes: [a, b]"
        lines.append(f"agents: {{names: *a{depth - 1}}}")
    return ("\n".join(lines) + "\n").encode()


def deep_nesting(rng, base):
    n = rng.choice([200, 999, 1001, 5000, 10000, 50000])
    style = rng.randint(0, 3)
    if style == 0:
        deep = "[" * n + "]" * n
    elif style == 1:
        deep = "{a: " * n + "1" + "}" * n
    elif style == 2:
        deep = "\n" + "".join("  " * k + "-\n" for k in range(min(n, 3000))) + "  " * min(n, 3000) + "x"
    else:
        deep = "- " * n + "x"
    key = rng.choice(["nodes", "sensor", "description", "bogus"])
    return base + f"\n{key}: {deep}\n".encode()


def tame(rng, data):
    """Numbers changed within plausible ranges: most such plans check fine and get simulated."""
    spans = [m.span() for m in NUMBER.finditer(data)]
    for _ in range(rng.randint(1, 3)):
        if not spans:
            break
        s, e = rng.choice(spans)
        old = data[s:e]
        new = f"{rng.uniform(0, 9):.2f}".encode() if b"." in old else str(rng.randint(0, 12)).encode()
        data = data[:s] + new + data[e:]
        spans = [m.span() for m in NUMBER.finditer(data)]
    return data


def mutate_once(rng, data):
    if rng.random() < 0.15:
        return tame(rng, data)
    kind = rng.randrange(14)
    if kind == 0 and data:  # truncation
        return data[:rng.randrange(len(data))]
    if kind == 1 and data:  # byte flips
        b = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(b))
            b[i] = rng.choice([rng.randrange(256), ord(rng.choice(":-[]{}&*!|>#'\"\t\n 0123456789.e"))])
        return bytes(b)
    if kind in (2, 3, 4):  # a number replaced by a huge, negative, NaN or infinite one, maybe with a unit
        spans = [m.span() for m in NUMBER.finditer(data)]
        if spans:
            s, e = rng.choice(spans)
            unit = rng.choice(UNITS)
            # keep the unit that follows (a duration stays a duration) or replace it
            return data[:s] + (rng.choice(HUGE) + unit).encode() + data[e:]
    if kind == 5:  # wrong type for a value
        lines = data.split(b"\n")
        idx = [i for i, l in enumerate(lines) if b":" in l and not l.strip().startswith(b"#")]
        if idx:
            i = rng.choice(idx)
            k = lines[i].split(b":", 1)[0]
            lines[i] = k + b": " + rng.choice(WRONG).encode()
            return b"\n".join(lines)
    if kind == 6:  # unknown field
        lines = data.split(b"\n")
        lines.insert(rng.randrange(len(lines) + 1), rng.choice([b"bogus: 1", b"  bogus: x", b"sensor:\n  scann: {on: 4s}", b"radio: {reportLos: 0.1}"]))
        return b"\n".join(lines)
    if kind == 7:
        return alias_bomb(rng)
    if kind == 8:
        return deep_nesting(rng, data)
    if kind == 9:  # huge strings
        size = rng.choice([10_000, 70_000, 600_000, 1_100_000, 3_000_000])
        where = rng.randrange(3)
        big = "x" * size
        if where == 0:
            return data + f"\ndescription: \"{big}\"\n".encode()
        if where == 1:
            return data.replace(b"name: ", f"name: {big[:rng.choice([65, 300, 100000])]}".encode(), 1)
        return data + f"\nvariant: {big[:rng.choice([200, 300, 70000])]}\n".encode()
    if kind == 10 and data:  # invalid UTF-8
        i = rng.randrange(len(data))
        return data[:i] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x00", b"\xef\xbb\xbf"]) + data[i:]
    if kind == 11:  # positions, counts and grids out of range
        choice = rng.randrange(5)
        v = rng.choice(HUGE)
        if choice == 0:
            return re.sub(rb"position: \[[^\]]*\]", f"position: [{v}, {rng.choice(HUGE)}]".encode(), data, count=1)
        if choice == 1:
            return re.sub(rb"count: \d+", f"count: {v}".encode(), data, count=1) if b"count:" in data else data + f"\nnodes: {{count: {v}}}\n".encode()
        if choice == 2:
            return data + f"\nnodes: {{count: 3, grid: {{columns: {rng.choice(HUGE)}, spacing: {v}m}}}}\n".encode()
        if choice == 3:
            return data + f"\nstart: {rng.choice(DATES)}\n".encode()
        return data + f"\nseed: {v}\n".encode()
    if kind == 12:  # empty, comments only, duplicate keys, tabs, a document stream
        return rng.choice([b"", b"# nothing\n", data + b"\nname: again\n", data.replace(b"  ", b"\t"), data + b"\n---\nname: second\n",
                           b"[]", b"\"just text\"", b"- a\n- b\n", b"&x [*x]", b"name: *undefined\n"])
    # durations out of range, each field
    field = rng.choice(["duration", "warmup", "sensor: {scan: {on", "sensor: {purgeAfter", "sensor: {connectionTimeout",
                        "radio: {connectLatency", "radio: {macRotation", "thresholds: {timeToFirstRead", "sensor: {advertInterval"])
    value = rng.choice(HUGE) + rng.choice(["h", "s", "ms", "m"])
    if ":" in field:
        head, rest = field.split(": {", 1)
        closing = "}" * (rest.count("{") + 1)
        return data + f"\n{head}: {{{rest}: {value}{closing}\n".encode()
    return re.sub(rf"(?m)^{field}:.*$".encode(), f"{field}: {value}".encode(), data) if re.search(rf"(?m)^{field}:".encode(), data) else data + f"\n{field}: {value}\n".encode()


def generate(rng, plans_src, out_dir, count):
    os.makedirs(out_dir, exist_ok=True)
    bases = []
    for name in sorted(os.listdir(plans_src)):
        if name.endswith(".yaml"):
            with open(os.path.join(plans_src, name), "rb") as f:
                bases.append(f.read())
    jobs = []
    for i in range(count):
        data = rng.choice(bases)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            data = mutate_once(rng, data)
        path = os.path.join(out_dir, f"plan-{i:04d}.yaml")
        special = rng.random()
        if special < 0.004:
            os.mkfifo(path)  # a FIFO: opening it for reading would block
        elif special < 0.008:
            os.makedirs(path)
        elif special < 0.012:
            os.symlink(rng.choice(["/dev/zero", "/dev/null", "/nonexistent/plan.yaml", "/proc/self/mem"]), path)
        else:
            with open(path, "wb") as f:
                f.write(data)
        jobs.append({"index": i, "path": path, "simulate": rng.choice(["5s", "10s", "20s"])})
    return jobs
