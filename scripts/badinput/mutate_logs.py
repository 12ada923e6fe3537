"""Seeded mutations of small real log folders (a simulated bundle, a fixture slice) for the
bad-input suite: truncated, garbled, huge lines, huge numbers, impossible dates, links to
/dev/zero and outside the folder, FIFOs, directories in place of files, missing files, wide
folders, manifests with absurd offsets and windows, and bad flags."""
import json
import os
import random
import re
import shutil
import sys
import stat

FILES = ["contacts.csv", "detection.csv", "battery.csv"]
HUGE = ["99999999999999999999999", "-99999999999999999999999", "1e308", "-1e308", "nan", "inf", "-inf",
        "9223372036854775807", "-9223372036854775808", "4294967296", "1e-320", "0x10", "", "-"]
BAD_TIMES = ["2022-02-31 10:00:00", "2022-02-29 10:00:00", "2020-12-08 25:61:00", "2020-12-08 23:59:61", "0000-00-00 00:00:00",
             "0001-01-01 00:00:00", "9999-12-31 23:59:59", "1969-12-31 23:59:59", "2020-13-08 10:00:00", "2020-12-32 10:00:00",
             "2020-12-08 23:00:00.99999999999999999999+9999", "2020-12-08T23:00:00Z", "2020-12-08 23:00:00-99:99", "2020-1x-08 10:00:00"]
FLAG_VALUES = ["nan", "inf", "-inf", "1e300", "-1e300", "9223372036854775808", "abc", "", "1e-300", "0"]
FLAG_TIMES = ["0001-01-01 00:00:00", "9999-12-31 23:59:59", "2022-02-31 00:00:00", "2020-12-08 25:61:00", "garbage", "", "nan",
              "1e300", "2020-12-08 23:00:00+9999", "99999-01-01 00:00:00", "2020-12-08 23:00:00.999999999999999999999999"]


def node_dirs(root):
    nodes = os.path.join(root, "nodes")
    base = nodes if os.path.isdir(nodes) else root
    # Real folders only: a device folder that an earlier mutation made a link (to /, /dev, ...)
    # must never be written through.
    return sorted(os.path.join(base, d) for d in os.listdir(base)
                  if d != "report" and os.path.isdir(os.path.join(base, d)) and not os.path.islink(os.path.join(base, d)))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    """Replaces whatever is at path (a link, a FIFO, a folder) by a regular file: never writes through."""
    replace_path(path)
    with open(path, "wb") as f:
        f.write(data)


def replace_path(path):
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def regular(path):
    """A regular file, not a link: safe to read and rewrite."""
    return os.path.isfile(path) and not os.path.islink(path)


def special_files(folder, names):
    """copytree must not open FIFOs (it would block): leave out everything but files, folders and links."""
    out = []
    for n in names:
        st = os.lstat(os.path.join(folder, n))
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            out.append(n)
    return out


def mutate(rng, root, outside):
    """Applies one mutation to the folder; returns extra flags, if any."""
    devices = node_dirs(root)
    if not devices:
        return []
    dev = rng.choice(devices)
    name = rng.choice(FILES)
    path = os.path.join(dev, name)
    manifest = os.path.join(root, "manifest.json")
    kind = rng.randrange(17)
    if kind == 0 and regular(path):  # truncated
        data = read(path)
        write(path, data[:rng.randrange(len(data) + 1)])
    elif kind == 1 and regular(path):  # garbled bytes
        b = bytearray(read(path))
        for _ in range(rng.randint(1, 50)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        write(path, bytes(b))
    elif kind == 2 and regular(path):  # huge lines and many fields
        big = rng.choice([b"A" * rng.choice([70_000, 2_000_000]), b"," * rng.choice([1000, 100_000]), b"\x00" * 5000,
                          b"2020-12-08 23:00:00,BLE," + b"x," * 5000 + b"\n", b'"' * 70_000])
        with open(path, "ab") as f:
            f.write(b"\n" + big + rng.choice([b"\n", b""]))
    elif kind == 3 and regular(os.path.join(dev, "contacts.csv")):  # huge numbers in RSSI rows
        c = os.path.join(dev, "contacts.csv")
        data = read(c)
        v = rng.choice(HUGE).encode()
        data = re.sub(rb"RSSI:-?[\d.]+", lambda m: b"RSSI:" + v if rng.random() < 0.3 else m.group(0), data)
        write(c, data)
    elif kind == 4 and regular(os.path.join(dev, "contacts.csv")):  # impossible dates
        c = os.path.join(dev, "contacts.csv")
        lines = read(c).split(b"\n")
        for _ in range(rng.randint(1, 20)):
            i = rng.randrange(len(lines))
            if len(lines[i]) > 19:
                lines[i] = rng.choice(BAD_TIMES).encode() + lines[i][19:]
        write(c, b"\n".join(lines))
    elif kind == 5:  # a link to /dev/zero, to a file outside, to a directory, dangling
        replace_path(path)
        os.symlink(rng.choice(["/dev/zero", "/dev/urandom", os.path.join(outside, "secret.csv"), "/", "/nonexistent", "/proc/self/mem",
                               os.path.relpath(os.path.join(outside, "secret.csv"), dev)]), path)
    elif kind == 6:  # a FIFO
        replace_path(path)
        os.mkfifo(path)
    elif kind == 7:  # a directory in place of a file
        replace_path(path)
        os.makedirs(os.path.join(path, "inner"))
    elif kind == 8:  # missing files or folders
        what = rng.randrange(3)
        if what == 0:
            replace_path(path)
        elif what == 1:
            shutil.rmtree(dev)
        elif os.path.exists(manifest):
            replace_path(manifest)
    elif kind == 9 and regular(manifest):  # manifests with absurd numbers
        try:
            m = json.loads(read(manifest))
            m["nodes"][0], m["plan"]["name"]
        except (ValueError, KeyError, TypeError, IndexError):
            return []
        field = rng.randrange(7)
        absurd = rng.choice([1e300, -1e300, 1e20, -9.3e18, 9.2233720368547758e18, 3.2e9, 1e15])
        if field == 0:
            rng.choice(m["nodes"])["clockOffset"] = absurd
        elif field == 1:
            m["contactEvent"] = {"start": rng.choice(FLAG_TIMES + ["0001-01-01T00:00:00Z"]), "end": rng.choice(FLAG_TIMES + ["9999-12-31T23:59:59Z"])}
        elif field == 2:
            m["plan"]["warmup"] = absurd
        elif field == 3:
            m["plan"].setdefault("thresholds", {})["pairContinuityPct"] = absurd
        elif field == 4:
            rng.choice(m["nodes"])["name"] = rng.choice(["../../outside", "..", "/etc", "", "a/b", "x" * 300])
        elif field == 5:
            m["nodes"] = m["nodes"] * rng.choice([400, 1200])
        else:
            m["contactEvent"] = {"start": "2026-01-01T00:00:10Z", "end": rng.choice(["2026-12-31T00:00:00Z", "2500-01-01T00:00:00Z", "2025-01-01T00:00:00Z"])}
        text = json.dumps(m)
        if rng.random() < 0.2:
            text = text.replace(str(absurd), rng.choice(["1e999", "NaN", "-Infinity", "99999999999999999999999999999"]))
        write(manifest, text.encode())
    elif kind == 10 and os.path.exists(manifest):  # a manifest that is not a file, or garbage
        replace_path(manifest)
        what = rng.randrange(4)
        if what == 0:
            os.mkfifo(manifest)
        elif what == 1:
            os.symlink("/dev/zero", manifest)
        elif what == 2:
            os.makedirs(manifest)
        else:
            write(manifest, rng.choice([b"{", b"[]", b"null", b"\xff\xfe", b'{"nodes": 5}', b'{"contactEvent": {"start": 1, "end": []}}']))
    elif kind == 11:  # a wide folder: many devices, detection.csv with many fields
        src = devices[0]
        base = os.path.dirname(src)
        count = rng.choice([70, 150])
        tag = f"{rng.randrange(1 << 20):05x}"
        contacts = os.path.join(src, "contacts.csv")
        rows = b"".join(read(contacts).splitlines(keepends=True)[:100]) if regular(contacts) else b""
        names = [f"W{tag[:2]}{k:03d}" for k in range(count)]
        for k in range(count):
            d = os.path.join(base, f"wide{tag}-{k:03d}")
            os.makedirs(d)
            write(os.path.join(d, "detection.csv"), ",".join([f"wide{k:03d}", "Linux", "6.1", names[k]] + [n for n in names if n != names[k]]).encode() + b"\n")
            write(os.path.join(d, "contacts.csv"), rows)
    elif kind == 12:  # a device folder that is a link outside, or to /dev
        replace_path(dev)
        os.symlink(rng.choice([outside, "/dev", "/proc/self", "/"]), dev)
    elif kind == 13:  # empty and odd files
        replace_path(path)
        write(path, rng.choice([b"", b"\n", b"\r\n", b"\xef\xbb\xbf", b"\x00" * 100, b",,,,,,,,,,\n" * 100, b'"\n' * 10]))
    elif kind == 14 and os.path.exists(os.path.join(root, "manifest.json")):  # a report folder that is a link outside
        replace_path(os.path.join(root, "report"))
        os.symlink(outside, os.path.join(root, "report"))
        return ["no-out"]
    elif kind == 15:  # bad flags
        flag = rng.randrange(4)
        target = os.path.basename(dev)
        # --flag=VALUE: a separate value starting with "-" would be taken for an option by the
        # argument parser (a usage error, exit 64) and never reach the checks under test.
        if flag == 0:
            return [f"--timeshift={target}={rng.choice(FLAG_VALUES)}"]
        if flag == 1:
            return [f"--ce-start={rng.choice(FLAG_TIMES)}", f"--ce-end={rng.choice(FLAG_TIMES)}"]
        if flag == 2:
            return [f"--filter-start={rng.choice(FLAG_TIMES)}"]
        return [f"--timeshift=nosuchdevice={rng.choice(FLAG_VALUES)}", "--timeshift==1"]
    else:  # a summary.json to compare or regress, mangled
        report = os.path.join(root, "report")
        if os.path.islink(report):
            return []
        os.makedirs(report, exist_ok=True)
        s = os.path.join(report, "summary.json")
        replace_path(s)
        what = rng.randrange(4)
        if what == 0:
            os.mkfifo(s)
        elif what == 1:
            os.symlink("/dev/zero", s)
        elif what == 2:
            write(s, b'{"herald": {"continuitypct": 1e999}}')
        else:
            write(s, b"\xff" * 100)
        return ["compare"]
    return []


def generate(rng, bases, out_dir, outside, count):
    os.makedirs(out_dir, exist_ok=True)
    keys = sorted(bases)
    jobs = []
    for i in range(count):
        key = rng.choice(keys)
        src, flags = bases[key]
        root = os.path.join(out_dir, f"logs-{i:04d}")
        shutil.copytree(src, root, symlinks=True)
        extra = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            try:
                extra += mutate(rng, root, outside)
            except OSError as e:  # two mutations that do not combine (deterministic for a seed)
                print(f"badinput: logs-{i:04d}: mutation skipped: {e}", file=sys.stderr)
        out = os.path.join(os.path.dirname(out_dir), "out", f"logs-{i:04d}")
        command = "analyse"
        args = []
        if "compare" in extra:
            extra.remove("compare")
            command = rng.choice(["compare", "regress"])
        if command == "compare":
            args = ["compare", root, src]
        elif command == "regress":
            # --tolerance=VALUE: as two arguments, "-1" would be taken for an option (a usage error, exit 64).
            args = ["regress", root, "--baseline", src] + rng.choice([[], ["--tolerance=" + rng.choice(["nan", "inf", "-1", "1e300", "2"])]])
        else:
            args = ["analyse", root, "--no-history"] + flags
            if "no-out" in extra:
                extra.remove("no-out")
            else:
                args += ["--out", out]
            args += extra
        # Allowed outputs: the --out folder, and the default report places beside or inside the input.
        jobs.append({"index": i, "path": root, "command": command, "args": args,
                     "outputs": [os.path.join(root, "report"), root + "-report"]})
    return jobs
