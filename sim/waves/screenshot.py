"""A headless screenshot of GTKWave on a save file: ``python -m sim.waves.screenshot X.gtkw
OUT.png``.

Starts a private X server (``Xvfb``, Debian package xvfb) on a free display, opens GTKWave
on the save file there, waits until the picture stops changing, grabs the screen with
``xwd`` (package x11-apps) and writes it as a PNG (an indexed one when the picture has at
most 256 colours, which keeps it small). Needs no window manager, no ImageMagick and no
Python imaging library: the XWD dump is decoded and the PNG encoded here with numpy and
zlib. The save file's ``[size]`` sets the window's size; the screen is made to fit it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["TOOLS", "missing_tools", "decode_xwd", "encode_png", "screenshot", "main"]

#: Programs the screenshot needs, with the Debian package that has each.
TOOLS = {"Xvfb": "xvfb", "gtkwave": "gtkwave", "xwd": "x11-apps"}

#: GTKWave settings for the picture: no splash screen, no signal-search tree (more room for
#: the waves), smaller fonts (more rows).
GTKWAVE_RC = ("splash_disable 1", "hide_sst 1", "fontname_signals Monospace 9",
              "fontname_waves Monospace 8")


def missing_tools() -> dict[str, str]:
    """The programs of :data:`TOOLS` that are not on ``PATH``, with their packages."""
    return {tool: package for tool, package in TOOLS.items() if shutil.which(tool) is None}


def decode_xwd(raw: bytes) -> np.ndarray:
    """An ``xwd`` dump of a TrueColor screen (24 or 32 bits a pixel, as Xvfb's 24-bit screen
    gives) as an ``(height, width, 3)`` uint8 RGB array."""
    fields = struct.unpack(">25I", raw[:100])
    (header_size, version, _format, _depth, width, height, _xoff, byte_order, _unit,
     _bit_order, _pad, bits_per_pixel, bytes_per_line, _visual, red_mask, green_mask,
     blue_mask, _bits_rgb, _cmap_entries, ncolors) = fields[:20]
    if version != 7 or bits_per_pixel not in (24, 32):
        raise ValueError(f"unsupported xwd dump: version {version}, "
                         f"{bits_per_pixel} bits a pixel")
    start = header_size + 12 * ncolors
    rows = np.frombuffer(raw, dtype=np.uint8, count=height * bytes_per_line,
                         offset=start).reshape(height, bytes_per_line)
    step = bits_per_pixel // 8
    pixels = rows[:, :width * step].reshape(height, width, step).astype(np.uint32)
    order = range(step) if byte_order == 0 else reversed(range(step))  # 0: LSB first
    value = np.zeros((height, width), dtype=np.uint32)
    for shift, index in enumerate(order):
        value |= pixels[:, :, index] << np.uint32(8 * shift)

    def channel(mask: int) -> np.ndarray:
        low = (mask & -mask).bit_length() - 1
        return ((value & np.uint32(mask)) >> np.uint32(low)).astype(np.uint8)

    return np.stack([channel(red_mask), channel(green_mask), channel(blue_mask)], axis=-1)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (struct.pack(">I", len(body)) + kind + body +
            struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def _unpack(colours: np.ndarray) -> np.ndarray:
    return np.stack([(colours >> 16) & 0xFF, (colours >> 8) & 0xFF, colours & 0xFF],
                    axis=-1).astype(np.int32)


def encode_png(rgb: np.ndarray, max_colours: int | None = 256) -> bytes:
    """A PNG of an ``(height, width, 3)`` uint8 picture: indexed colour when it has at most
    *max_colours* (<= 256) colours, else 8-bit RGB. With more colours than that and
    *max_colours* set, the rarest ones (anti-aliased text edges) become the nearest of the
    most frequent ones, which keeps the file small; ``None`` keeps every colour."""
    height, width, _ = rgb.shape
    packed = (rgb[:, :, 0].astype(np.uint32) << 16 | rgb[:, :, 1].astype(np.uint32) << 8 |
              rgb[:, :, 2].astype(np.uint32))
    colours, index, counts = np.unique(packed, return_inverse=True, return_counts=True)
    index = index.reshape(-1)
    if max_colours is not None and len(colours) > max_colours:
        keep = np.sort(np.argsort(counts)[::-1][:max_colours])
        kept = _unpack(colours[keep])
        distance = ((_unpack(colours)[:, None, :] - kept[None, :, :]) ** 2).sum(axis=-1)
        index = distance.argmin(axis=1)[index]
        colours = colours[keep]
    if len(colours) <= 256:
        header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
        palette = b"".join(struct.pack(">I", int(c))[1:] for c in colours)
        lines = index.reshape(height, width).astype(np.uint8)
        extra = [_chunk(b"PLTE", palette)]
    else:
        header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        lines = rgb.reshape(height, width * 3)
        extra = []
    raw = np.hstack([np.zeros((height, 1), dtype=np.uint8), lines]).tobytes()  # filter 0
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + b"".join(extra) +
            _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b""))


def _free_display() -> int:
    for number in range(99, 199):
        if not Path(f"/tmp/.X{number}-lock").exists() and \
                not Path(f"/tmp/.X11-unix/X{number}").exists():
            return number
    raise RuntimeError("no free X display number between :99 and :198")


def _window_size(gtkw: Path) -> tuple[int, int]:
    match = re.search(r"^\[size\] (\d+) (\d+)", Path(gtkw).read_text(), re.MULTILINE)
    return (int(match[1]), int(match[2])) if match else (1600, 1000)


def _stage(gtkw: Path, folder: Path) -> Path:
    """Copy the save file and the dump it names into *folder*, the save file naming the dump
    by its bare name: the picture's title then shows no path of the machine it was made on."""
    text = gtkw.read_text()
    match = re.search(r'^\[dumpfile\] "([^"]*)"', text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{gtkw} names no [dumpfile]")
    dump = Path(match[1])
    if not dump.is_absolute():
        dump = gtkw.resolve().parent / dump
    shutil.copyfile(dump, folder / dump.name)
    text = text.replace(match[0], f'[dumpfile] "{dump.name}"')
    text = re.sub(r"^\[savefile\] .*\n", "", text, flags=re.MULTILINE)
    staged = folder / gtkw.name
    staged.write_text(text)
    return staged


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def screenshot(gtkw: Path, png: Path, *, settle: float = 2.0, timeout: float = 60.0) -> Path:
    """Open GTKWave on *gtkw* under a private Xvfb and save the screen as *png*; returns
    *png*. Raises :class:`RuntimeError` when a program is missing or GTKWave draws nothing
    within *timeout* seconds."""
    missing = missing_tools()
    if missing:
        raise RuntimeError("missing: " + ", ".join(missing) + "; install them with: apt-get "
                           "install " + " ".join(sorted(set(missing.values()))))
    width, height = _window_size(gtkw)
    number = _free_display()
    display = f":{number}"
    env = {**os.environ, "DISPLAY": display}
    env.pop("WAYLAND_DISPLAY", None)
    with tempfile.TemporaryDirectory(prefix="amtpu-shot-") as tmp:
        log = open(Path(tmp) / "x.log", "w")
        xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", f"{width}x{height}x24",
                                 "-nolisten", "tcp"], stdout=log, stderr=subprocess.STDOUT)
        viewer = None
        try:
            deadline = time.monotonic() + timeout
            while not Path(f"/tmp/.X11-unix/X{number}").exists():
                if xvfb.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Xvfb did not start on {display}; see {log.name}")
                time.sleep(0.1)
            rc = [arg for setting in GTKWAVE_RC for arg in ("--rcvar", setting)]
            shown = _stage(Path(gtkw), Path(tmp))
            viewer = subprocess.Popen(["gtkwave", *rc, shown.name], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=tmp)
            previous, stable_since = None, None
            while True:
                if viewer.poll() is not None:
                    raise RuntimeError(f"gtkwave exited ({viewer.returncode}) before the "
                                       f"screenshot; log:\n{(Path(tmp) / 'x.log').read_text()}")
                raw = subprocess.run(["xwd", "-root", "-silent"], env=env, check=True,
                                     capture_output=True).stdout
                picture = decode_xwd(raw)
                drawn = len(np.unique(picture.reshape(-1, 3)[::97], axis=0)) > 8
                now = time.monotonic()
                if drawn and previous is not None and np.array_equal(picture, previous):
                    stable_since = stable_since or now
                    if now - stable_since >= settle:
                        break
                else:
                    stable_since = None
                previous = picture
                if now > deadline:
                    raise RuntimeError(f"GTKWave did not settle within {timeout} s")
                time.sleep(0.5)
        finally:
            if viewer is not None:
                _stop(viewer)
            _stop(xvfb)
            log.close()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    png.write_bytes(encode_png(picture))
    return png


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.waves.screenshot",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("gtkw", type=Path, help="GTKWave save file")
    parser.add_argument("png", type=Path, help="picture to write")
    args = parser.parse_args(argv)
    try:
        path = screenshot(args.gtkw, args.png)
    except RuntimeError as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 1
    print(f"screenshot: {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
