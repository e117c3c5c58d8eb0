#!/usr/bin/env python3
"""Counts the pixels of given colours in a PNG, for the tests that check what a browser drew.

usage: png_colours.py IMAGE.png RRGGBB [RRGGBB ...]
prints one line per colour, "RRGGBB COUNT": the pixels of exactly that colour (antialiasing blends
a line's edges into the background; its core keeps the colour). Exit status 2 for a PNG it cannot
read.

Reads 8-bit RGB and RGBA PNGs, not interlaced, as the PNG specification (W3C, 2003) lays them out:
the signature, chunks of length | type | data | CRC, the IDAT data one zlib stream of scanlines,
each a filter byte (0 none, 1 sub, 2 up, 3 average, 4 Paeth) and the filtered bytes.
"""
import struct
import sys
import zlib


def read_rgb_rows(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        print(f"{path}: not a PNG", file=sys.stderr)
        sys.exit(2)
    offset, idat, header = 8, b"", None
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        body = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace != 0:
        print(f"{path}: only 8-bit RGB or RGBA, not interlaced (got depth {depth}, colour type {colour_type})",
              file=sys.stderr)
        sys.exit(2)
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    rows, previous = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = unfilter(raw[start], raw[start + 1:start + 1 + stride], previous, channels)
        rows.append(row)
        previous = row
    return rows, channels


def add_bytes(a, b):
    """a + b byte by byte, modulo 256, on whole rows at once (no carry crosses a byte)."""
    n = len(a)
    x, y = int.from_bytes(a, "big"), int.from_bytes(b, "big")
    low, high = int.from_bytes(b"\x7f" * n, "big"), int.from_bytes(b"\x80" * n, "big")
    return (((x & low) + (y & low)) ^ ((x ^ y) & high)).to_bytes(n, "big")


def unfilter(kind, row, up, channels):
    if kind == 0:
        return bytes(row)
    if kind == 2:
        return add_bytes(row, up)
    out = bytearray(row)
    for i in range(len(out)):
        left = out[i - channels] if i >= channels else 0
        if kind == 1:
            out[i] = (out[i] + left) & 0xFF
        elif kind == 3:
            out[i] = (out[i] + (left + up[i]) // 2) & 0xFF
        else:  # 4, Paeth
            up_left = up[i - channels] if i >= channels else 0
            estimate = left + up[i] - up_left
            a, b, c = abs(estimate - left), abs(estimate - up[i]), abs(estimate - up_left)
            out[i] = (out[i] + (left if a <= b and a <= c else up[i] if b <= c else up_left)) & 0xFF
    return bytes(out)


def main():
    path, colours = sys.argv[1], sys.argv[2:]
    rows, channels = read_rgb_rows(path)
    index_of = {tuple(int(colour[i:i + 2], 16) for i in (0, 2, 4)): index for index, colour in enumerate(colours)}
    counts = [0] * len(colours)
    for row in rows:
        for pixel in zip(row[0::channels], row[1::channels], row[2::channels]):
            index = index_of.get(pixel)
            if index is not None:
                counts[index] += 1
    for colour, count in zip(colours, counts):
        print(colour, count)


if __name__ == "__main__":
    main()
