#!/usr/bin/env python3
"""A headless EGL/OpenGL client that allocates graphics objects on command (incident 4's workload).

Reads commands on stdin, one per line, and answers each with one JSON line:
  fb N [WxH]       N more framebuffers (colour + depth renderbuffers), cleared, never released
  tex N [WxH]      N more empty RGBA8 textures (storage allocated by the driver, no client data)
  texfb N [WxH]    N more RGBA8 textures used as render targets (attached to a framebuffer, cleared)
  texdata N [WxH]  N more RGBA8 textures uploaded from client memory
  draw N           clear every framebuffer made so far N times (steady rendering, no new objects)
  buf N MIB        N more buffers of MIB MiB (reserve, no data)
  ctx N            N more standalone EGL contexts
  release          release every object made so far
  quit             exit
Objects are created with moderngl (EGL backend) on the NVIDIA EGL vendor library; nothing is
freed until `release` or exit, exactly like the leaking renderer of incident 4.
"""

import json
import os
import sys
import time


def rss_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def context():
    import moderngl

    errors = []
    for kw in ({"libgl": "libGL.so.1", "libegl": "libEGL.so.1"}, {}):
        try:
            return moderngl.create_context(standalone=True, backend="egl", **kw)
        except Exception as exc:  # try the next library naming
            errors.append(f"{type(exc).__name__}: {exc}")
    raise RuntimeError("; ".join(errors))


def size(arg: str | None, default: int = 4096) -> tuple[int, int]:
    if not arg:
        return default, default
    w, _, h = arg.partition("x")
    return int(w), int(h or w)


def main() -> None:
    t0 = time.monotonic()
    try:
        ctx = context()
    except Exception as exc:
        print(json.dumps({"pid": os.getpid(), "error": str(exc)}), flush=True)
        return
    info = {k: ctx.info.get(k) for k in ("GL_VENDOR", "GL_RENDERER", "GL_VERSION")}
    print(json.dumps({"pid": os.getpid(), "ready": True, "gl": info, "rss_kib": rss_kib(),
                      "t": round(time.monotonic() - t0, 3)}), flush=True)
    objs: dict[str, list] = {"fb": [], "tex": [], "texdata": [], "buf": [], "ctx": []}
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cmd, args = parts[0], parts[1:]
        t = time.monotonic()
        out = {"cmd": line.strip()}
        try:
            n = int(args[0]) if args else 1
            if cmd == "fb":
                w, h = size(args[1] if len(args) > 1 else None)
                for _ in range(n):
                    fbo = ctx.simple_framebuffer((w, h))
                    fbo.use()
                    fbo.clear(0.2, 0.3, 0.4, 1.0)
                    objs["fb"].append(fbo)
                ctx.finish()
            elif cmd == "draw":
                for _ in range(n):
                    for fbo in objs["fb"]:
                        fbo.use()
                        fbo.clear(0.3, 0.2, 0.1, 1.0)
                ctx.finish()
            elif cmd == "texfb":
                w, h = size(args[1] if len(args) > 1 else None)
                for _ in range(n):
                    tx = ctx.texture((w, h), 4)
                    fbo = ctx.framebuffer(color_attachments=[tx])
                    fbo.use()
                    fbo.clear(0.1, 0.2, 0.3, 1.0)
                    objs["tex"].append(tx)
                    objs["fb"].append(fbo)
                ctx.finish()
            elif cmd == "tex":
                w, h = size(args[1] if len(args) > 1 else None)
                for _ in range(n):
                    tx = ctx.texture((w, h), 4)
                    objs["tex"].append(tx)
                ctx.finish()
            elif cmd == "texdata":
                w, h = size(args[1] if len(args) > 1 else None, 2048)
                data = bytes(w * h * 4)
                for _ in range(n):
                    objs["texdata"].append(ctx.texture((w, h), 4, data))
                ctx.finish()
            elif cmd == "buf":
                mib = int(args[1]) if len(args) > 1 else 256
                for _ in range(n):
                    objs["buf"].append(ctx.buffer(reserve=mib << 20))
                ctx.finish()
            elif cmd == "ctx":
                for _ in range(n):
                    objs["ctx"].append(context())
            elif cmd == "release":
                for kind, lst in objs.items():
                    for o in lst:
                        o.release()
                    lst.clear()
                ctx.finish()
            elif cmd == "quit":
                print(json.dumps({"cmd": "quit"}), flush=True)
                return
            else:
                out["error"] = f"unknown command {cmd}"
        except Exception as exc:  # report and stay alive: the caller decides
            out["error"] = f"{type(exc).__name__}: {exc}"
        out.update({"counts": {k: len(v) for k, v in objs.items()}, "rss_kib": rss_kib(),
                    "seconds": round(time.monotonic() - t, 3)})
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
