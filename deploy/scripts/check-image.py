#!/usr/bin/env python3
"""Checks the install-cni OCI archive that build-image.sh made: what a node will run is exactly
what this workspace just built, and nothing else. One PASS/FAIL line per check; exit 1 on a FAIL.

  * the archive is one OCI image, tagged with the image the rendered manifest runs
  * linux/amd64; entrypoint /usr/local/bin/install-cni; user 0:0; env: PATH only (every setting
    comes from the DaemonSet, none baked into the image); no Cmd, no exposed ports, no volumes
  * files: exactly /opt/cni/bin/{istio-cni,istio-nftables} and /usr/local/bin/install-cni,
    each executable, statically linked (no PT_INTERP / DT_NEEDED) and byte-identical (sha256) to
    the release build; and the iptables-legacy toolset (stage-legacy-tools.sh): every other file
    byte-identical to the same path on this Debian machine and shipped by one of LEGACY_PACKAGES
    (dpkg -S), every symlink the host's, the seven tools present and executable, and every
    interpreter and DT_NEEDED library of every ELF in it found inside the image
  * size: the compressed layers (what a node pulls) within --limit-mb

`check-image.py --extract-bins ARCHIVE DIR` writes the image's three binaries into DIR (named as
built) for integration/scripts/check-bins.sh.
"""
import argparse, gzip, hashlib, io, json, os, posixpath, struct, subprocess, sys, tarfile

ENTRYPOINT = ["/usr/local/bin/install-cni"]
FILES = {
    "opt/cni/bin/istio-cni": "istio-cni",
    "opt/cni/bin/istio-nftables": "istio-nftables",
    "usr/local/bin/install-cni": "install-cni",
}
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
# What the node daemon runs on an iptables-legacy node (found through PATH).
LEGACY_TOOLS = [f"usr/sbin/{t}" for t in (
    "iptables-legacy", "iptables-legacy-restore", "iptables-legacy-save",
    "ip6tables-legacy", "ip6tables-legacy-restore", "ip6tables-legacy-save", "ipset")]
# The Debian packages the toolset's files may come from: the tools, their libraries, libc.
LEGACY_PACKAGES = {"iptables", "ipset", "libc6", "libxtables12", "libip4tc2", "libip6tc2",
                   "libipset13", "libmnl0", "libnetfilter-conntrack3", "libnfnetlink0"}
# Where the loader looks without an ld.so.cache (Debian's built-in search path).
LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib")

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'}  image: {name}" + ("" if ok or not detail else f"  ({detail})"))


def elf_is_static(data):
    """True when a 64-bit little-endian ELF has no PT_INTERP and no PT_DYNAMIC DT_NEEDED entry."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
        if p_type == 2:  # PT_DYNAMIC: look for DT_NEEDED (1)
            for off in range(p_offset, p_offset + p_filesz, 16):
                tag, _ = struct.unpack_from("<qQ", data, off)
                if tag == 1:
                    return False
                if tag == 0:
                    break
    return True


def elf_deps(data):
    """(PT_INTERP or None, [DT_NEEDED names]) of a 64-bit little-endian ELF; None if not an ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    interp, dynamic, loads = None, None, []
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:
            interp = data[p_offset:p_offset + p_filesz].rstrip(b"\0").decode()
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
        elif p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
    if not dynamic:
        return interp, []
    entries = []
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        entries.append((tag, val))
    strtab = next(v for t, v in entries if t == 5)  # DT_STRTAB, a virtual address
    strtab_off = next(o + strtab - va for va, o, n in loads if va <= strtab < va + n)
    cstr = lambda at: data[at:data.index(b"\0", at)].decode()  # noqa: E731
    return interp, [cstr(strtab_off + v) for t, v in entries if t == 1]


def resolve(path, links, depth=0):
    """`path` (relative to the image root) with the image's own symlinks followed, or None."""
    out = []
    for part in path.split("/"):
        cur = "/".join(out + [part])
        if cur in links:
            if depth > 40:
                return None
            target = links[cur]
            joined = target.lstrip("/") if target.startswith("/") else "/".join(out + [target])
            cur = resolve(posixpath.normpath(joined), links, depth + 1)
            if cur is None:
                return None
        out = cur.split("/") if cur else []
    return "/".join(out)


def debian_package(path):
    """The Debian package shipping /path on this host (merged /usr: also tried without /usr)."""
    for p in (f"/{path}", f"/{path[len('usr/'):]}" if path.startswith("usr/") else None):
        r = p and subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r and r.returncode == 0:
            return r.stdout.split(":", 1)[0]
    return None


def check_legacy_tools(files, links):
    """The iptables-legacy toolset: Debian's own files, complete (see the module doc)."""
    extra = {p: d for p, d in files.items() if p not in FILES}
    foreign = []
    for path, (_, data) in sorted(extra.items()):
        try:
            with open(f"/{path}", "rb") as f:
                same = f.read() == data
        except OSError:
            same = False
        pkg = debian_package(path)
        if not same or pkg not in LEGACY_PACKAGES:
            foreign.append(f"{path} (identical: {same}, package: {pkg})")
    check(f"legacy tools: all {len(extra)} other files are this host's, from {sorted(LEGACY_PACKAGES)}",
          extra and not foreign, "; ".join(foreign[:5]))
    wrong_links = [f"{p} -> {t}" for p, t in sorted(links.items())
                   if not os.path.islink(f"/{p}") or os.readlink(f"/{p}") != t]
    check(f"legacy tools: all {len(links)} symlinks are the host's", not wrong_links, "; ".join(wrong_links[:5]))
    missing = [t for t in LEGACY_TOOLS if not (resolve(t, links) in files and files[resolve(t, links)][0] & 0o111)]
    check(f"legacy tools: {', '.join(os.path.basename(t) for t in LEGACY_TOOLS)} executable", not missing, str(missing))
    unresolved = []
    for path, (_, data) in sorted(extra.items()):
        deps = elf_deps(data)
        if deps is None:
            continue
        interp, needed = deps
        if interp and resolve(interp.lstrip("/"), links) not in files:
            unresolved.append(f"{path}: interpreter {interp}")
        for lib in needed:
            if not any(resolve(f"{d}/{lib}", links) in files for d in LIB_DIRS):
                unresolved.append(f"{path}: {lib}")
    check("legacy tools: every interpreter and DT_NEEDED library is in the image", not unresolved,
          "; ".join(unresolved[:5]))


def image_files(archive):
    """{path: (mode, bytes)} of the image's regular files, from the archive's only manifest."""
    with tarfile.open(archive) as t:
        blobs = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    index = json.loads(blobs["index.json"])
    manifest = json.loads(blobs[f"blobs/sha256/{index['manifests'][0]['digest'].split(':', 1)[1]}"])
    files = {}
    for layer in manifest["layers"]:
        data = blobs[f"blobs/sha256/{layer['digest'].split(':', 1)[1]}"]
        raw = gzip.decompress(data) if layer["mediaType"].endswith("+gzip") else data
        with tarfile.open(fileobj=io.BytesIO(raw)) as t:
            for m in t.getmembers():
                if m.isfile():
                    files[m.name.lstrip("./")] = (m.mode, t.extractfile(m).read())
    return files


def extract_bins(archive, out):
    os.makedirs(out, exist_ok=True)
    files = image_files(archive)
    for path, bin_name in FILES.items():
        with open(os.path.join(out, bin_name), "wb") as f:
            f.write(files[path][1])
    print(f"image: {len(FILES)} binaries extracted to {out}")
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--extract-bins":
        return extract_bins(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("--archive", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--release-dir", required=True)
    ap.add_argument("--manifest", required=True, help="deploy/manifests/istio-cni.yaml")
    ap.add_argument("--limit-mb", type=float, default=20)
    a = ap.parse_args()

    with tarfile.open(a.archive) as t:
        blobs = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    blob = lambda digest: blobs[f"blobs/sha256/{digest.split(':', 1)[1]}"]  # noqa: E731
    index = json.loads(blobs["index.json"])
    refs = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
    check("one image in the archive, tagged as the manifest's image", refs == [a.image], str(refs))
    manifest_image = [l.split("image:", 1)[1].strip().strip('"') for l in open(a.manifest) if l.strip().startswith("image:")]
    check("the rendered manifest runs this image", manifest_image == [a.image], str(manifest_image))
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    cfg = config.get("config", {})
    check("linux/amd64", (config.get("os"), config.get("architecture")) == ("linux", "amd64"))
    check(f"entrypoint {ENTRYPOINT}, no cmd", cfg.get("Entrypoint") == ENTRYPOINT and not cfg.get("Cmd"), str(cfg))
    check("user 0:0", cfg.get("User") == "0:0", str(cfg.get("User")))
    check("env: PATH only (settings come from the DaemonSet)", cfg.get("Env") == ENV, str(cfg.get("Env")))
    check("no exposed ports, volumes or working dir", not any(cfg.get(k) for k in ("ExposedPorts", "Volumes", "WorkingDir")))

    files, dirs, links, others, compressed = {}, set(), {}, [], 0
    writable = []
    for layer in manifest["layers"]:
        data = blob(layer["digest"])
        compressed += len(data)
        raw = gzip.decompress(data) if layer["mediaType"].endswith("+gzip") else data
        check(f"layer {layer['digest'][:19]} matches its digest", hashlib.sha256(data).hexdigest() == layer["digest"].split(":")[1])
        with tarfile.open(fileobj=io.BytesIO(raw)) as t:
            for m in t.getmembers():
                name = m.name.lstrip("./")
                if not m.issym() and m.mode & 0o022:
                    writable.append(f"{name} {oct(m.mode)}")
                if m.isdir():
                    dirs.add(name)
                elif m.isfile():
                    files[name] = (m.mode, t.extractfile(m).read())
                elif m.issym():
                    links[name] = m.linkname
                else:
                    others.append(name)
    check(f"files: {sorted(FILES)} and the legacy tools, no devices, fifos or hard links",
          set(FILES) <= set(files) and not others, f"{sorted(FILES)} {others}")
    for path, bin_name in FILES.items():
        mode, data = files.get(path, (0, b""))
        with open(os.path.join(a.release_dir, bin_name), "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        got = hashlib.sha256(data).hexdigest()
        check(f"/{path}: the release build's {bin_name} (sha256 {want[:16]}), executable, static",
              got == want and mode & 0o111 == 0o111 and elf_is_static(data), f"sha256 {got[:16]} mode {oct(mode)}")
    check("no file or directory is group- or world-writable", not writable, "; ".join(writable[:5]))
    check_legacy_tools(files, links)
    mb = compressed / 1e6
    archive_mb = os.path.getsize(a.archive) / 1e6
    check(f"size: {mb:.1f} MB compressed (limit {a.limit_mb:g} MB; archive {archive_mb:.1f} MB)", mb <= a.limit_mb)
    failed = results.count(False)
    print(f"image: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
