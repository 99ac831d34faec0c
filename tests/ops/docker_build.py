"""Runs the build stage of docker/Dockerfile on the host, as Docker would:
WORKDIR is a fresh directory, each COPY copies exactly what it names from the
repository (keeping file times, as COPY does, and leaving out what
.dockerignore excludes), each RUN runs there with /bin/sh. The only change:
`target/` is a link to a shared directory, so the dependencies are built
once across runs (the Dockerfile's cached layer) while the crate itself is
built from the copied files every time. A file the build needs that no COPY
brings fails it. Prints the path of the binary the stage left in WORKDIR.

Usage: docker_build.py CONTEXT_DIR SHARED_TARGET_DIR"""

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ctx, shared = (os.path.abspath(p) for p in sys.argv[1:3])

ignore = []
if os.path.exists(os.path.join(ROOT, ".dockerignore")):
    for line in open(os.path.join(ROOT, ".dockerignore")):
        line = line.strip()
        if line and not line.startswith("#"):
            ignore.append(line.strip("/"))


def ignored(rel):
    return any(fnmatch.fnmatch(rel, p) or rel.startswith(p + "/") for p in ignore)


def copy(src_rel, dest):
    src = os.path.join(ROOT, src_rel)
    if not os.path.exists(src) or ignored(src_rel.strip("/")):
        sys.exit(f"docker_build.py: COPY {src_rel}: not in the build context")
    if os.path.isdir(src):
        for dirpath, dirnames, filenames in os.walk(src):
            rel_dir = os.path.relpath(dirpath, ROOT)
            dirnames[:] = [d for d in dirnames if not ignored(os.path.join(rel_dir, d))]
            for name in filenames:
                rel = os.path.join(rel_dir, name)
                if ignored(rel):
                    continue
                out = os.path.join(dest, os.path.relpath(os.path.join(dirpath, name), src))
                os.makedirs(os.path.dirname(out), exist_ok=True)
                shutil.copy2(os.path.join(dirpath, name), out)
    else:
        into = dest.endswith("/") or os.path.isdir(dest)
        out = os.path.join(dest, os.path.basename(src)) if into else dest
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copy2(src, out)


def sources(src_rel):
    """The files one COPY source brings, as Docker would see them."""
    src = os.path.join(ROOT, src_rel)
    if os.path.isfile(src):
        return [src_rel]
    found = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, ROOT)
        dirnames[:] = sorted(d for d in dirnames if not ignored(os.path.join(rel_dir, d)))
        found += [os.path.join(rel_dir, n) for n in sorted(filenames) if not ignored(os.path.join(rel_dir, n))]
    return found


text = re.sub(r"\\\n", " ", open(os.path.join(ROOT, "docker", "Dockerfile")).read())
lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
stage_lines = []
for line in lines:
    if line.startswith("FROM ") and stage_lines:
        break  # the build stage ends where the next begins
    stage_lines.append(line)

# Docker's layer cache, for the whole stage: what it runs, with what
# toolchain, on which files. Unchanged since the last success: nothing to do.
digest = hashlib.sha256()
digest.update(subprocess.run(["rustc", "-V"], capture_output=True, text=True).stdout.encode())
for line in stage_lines:
    digest.update(line.encode() + b"\n")
    if line.startswith("COPY "):
        for src in line.split()[1:-1]:
            for rel in sources(src) if os.path.exists(os.path.join(ROOT, src)) else [src]:
                digest.update(rel.encode() + b"\0")
                path = os.path.join(ROOT, rel)
                digest.update(open(path, "rb").read() if os.path.isfile(path) else b"(missing)")
stamp = ctx + ".done"
binary = os.path.join(ctx, "sessionless")
if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest() and os.path.exists(binary):
    print(f"docker_build.py: the build stage's inputs are those of the last successful run ({digest.hexdigest()[:12]}): cached")
    print(binary)
    sys.exit(0)

stage, workdir, env = None, None, dict(os.environ)
env.pop("CARGO_TARGET_DIR", None)
shutil.rmtree(ctx, ignore_errors=True)
if os.path.exists(stamp):
    os.remove(stamp)
for line in stage_lines:
    word, _, rest = line.partition(" ")
    if word == "FROM":
        stage = rest
        continue
    if word == "WORKDIR":
        workdir = ctx
        os.makedirs(ctx)
        os.makedirs(shared, exist_ok=True)
        os.symlink(shared, os.path.join(ctx, "target"))
    elif word == "ENV":
        key, _, value = rest.partition("=")
        env[key.strip()] = value.strip().strip('"')
    elif word == "COPY":
        *srcs, dest = rest.split()
        if any(s.startswith("--") for s in srcs):
            sys.exit(f"docker_build.py: COPY flags are not simulated: {line}")
        if os.path.isabs(dest):
            sys.exit(f"docker_build.py: COPY to an absolute path is not simulated: {line}")
        for src in srcs:
            copy(src, os.path.join(workdir, dest))
    elif word == "RUN":
        print(f"docker_build.py: RUN {rest}", flush=True)
        if subprocess.run(["/bin/sh", "-c", rest], cwd=workdir, env=env).returncode != 0:
            sys.exit(f"docker_build.py: FAIL: RUN {rest}")
    else:
        sys.exit(f"docker_build.py: {word} in the build stage is not simulated")
with open(stamp, "w") as f:
    f.write(digest.hexdigest())
print(binary)
