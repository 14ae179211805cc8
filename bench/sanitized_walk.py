"""The C walk (`collector/receivers/_otlp_columns.c`) under AddressSanitizer and UndefinedBehaviorSanitizer.

Builds the extension with `-fsanitize=address,undefined` into a temporary folder, then runs this script again with
libasan preloaded: mutated requests (bytes flipped, cut, repeated, inserted) of `bench/ingest.py` and of a request
with large resources and scopes, valid requests of random shape (several resources and scopes, some repeated), and
arbitrary bytes, each through the walk with the default limits, small ones and a random `request_row_bytes`, every
buffer it answers read to the end. A sanitizer report aborts the run with its trace; the last line says how
many inputs ran and how many the walk decoded. Needs gcc. Run: `python bench/sanitized_walk.py [--inputs 20000]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "collector" / "receivers" / "_otlp_columns.c"


def build(folder: Path) -> Path:
    out = folder / ("_otlp_columns" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined", f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o",
                    str(out)], check=True)
    return out


def seeds() -> list[bytes]:
    sys.path.insert(0, str(ROOT))
    from bench.ingest import build_requests
    from tests.support.amplified_requests import spans_request, text_attribute

    return [build_requests(1, 16)[0], build_requests(1, 8, sdk_resource=True)[0],
            spans_request([text_attribute("service.name", "a"), text_attribute("session.id", "k" * 300)], 12,
                          ("scope" * 40, "1.0")),
            spans_request([], 3)]


def generated(rng: random.Random) -> bytes:
    """A valid request of random shape: 1-6 ResourceSpans (some with the same resource), 1-4 ScopeSpans each,
    0-12 spans each, random attributes: the paths that decode whole, where the resource and scope indices are."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def value() -> AnyValue:
        kind = rng.randrange(4)
        if kind == 0:
            return AnyValue(string_value=rng.choice(["", "x", "é漢", "a\"b\\c\n", "k" * rng.randrange(2000)]))
        if kind == 1:
            return AnyValue(int_value=rng.randrange(-2**63, 2**63))
        if kind == 2:
            return AnyValue(double_value=rng.choice([0.0, -1e-7, 1e300, 2.5]))
        return AnyValue(bool_value=rng.random() < 0.5)

    request, shared = ExportTraceServiceRequest(), [KeyValue(key="service.name", value=AnyValue(string_value="s"))]
    span_id = 1
    for _ in range(rng.randint(1, 6)):
        rs = request.resource_spans.add()
        rs.resource.attributes.extend(shared if rng.random() < 0.4 else
                                      [KeyValue(key=f"r{i}", value=value()) for i in range(rng.randrange(6))])
        for _ in range(rng.randint(1, 4)):
            ss = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = rng.choice([("", ""), ("mcp", "1.0"), ("n" * 300, "v")])
            for _ in range(rng.randrange(13)):
                span = ss.spans.add(trace_id=rng.randbytes(15) + b"\x01", span_id=span_id.to_bytes(8, "big"),
                                    name="s", start_time_unix_nano=rng.randrange(2**62))
                span.attributes.extend(KeyValue(key=f"a{i}", value=value()) for i in range(rng.randrange(8)))
                span_id += 1
    return request.SerializeToString()


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        what, at = rng.randrange(5), rng.randrange(len(out) + 1)
        if what == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif what == 1:
            del out[at:at + rng.randint(1, 16)]
        elif what == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif what == 3 and out:
            out[at:at] = out[max(0, at - 64):at]
        else:
            out = out[:at]
    return bytes(out)


def fuzz(module_path: Path, inputs: int) -> None:
    spec = importlib.util.spec_from_file_location("_otlp_columns", module_path)
    assert spec is not None and spec.loader is not None
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    import orjson

    keys = (b"gen_ai.conversation.id", b"session.id")
    rng, pool, decoded = random.Random(7), seeds(), 0
    for n in range(inputs):
        which = n % 10
        payload = (rng.randbytes(rng.randrange(300)) if which == 0 else generated(rng) if which < 4
                   else mutate(rng, rng.choice(pool)))
        for limits in ((4096, 2**24, 1024, 1024, 1024, 2**26), (3, 8, 2, 1, 2, 4096),
                       (4096, 2**24, 1024, 1024, 1024, rng.randrange(200, 20_000))):
            out = walk.columns(payload, keys, *limits, orjson.dumps)
            if out is None:
                continue
            decoded += 1
            _rows, fixed, strings, resources, scopes = out
            total = sum(len(bytes(b)) for b in fixed)
            for offsets, data, validity, _nulls in strings:
                total += len(bytes(offsets)) + len(bytes(data)) + (len(bytes(validity)) if validity is not None else 0)
            total += sum(len(a) + len(b or b"") for a, b in resources) + sum(len(a) + len(b) for a, b in scopes)
    print(f"{inputs} inputs (a tenth arbitrary bytes, three tenths generated valid requests, the rest mutated) x 3 "
          f"limits (default, small, a random request_row_bytes) through the sanitized C walk: {decoded} decoded "
          "whole, the rest left to Python; no sanitizer report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=20_000)
    parser.add_argument("--module", type=Path, help=argparse.SUPPRESS)  # the second run's sanitized build
    args = parser.parse_args()
    if args.module:
        fuzz(args.module, args.inputs)
        return
    with tempfile.TemporaryDirectory() as tmp:
        module = build(Path(tmp))
        libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        env = {**os.environ, "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
               "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "PYTHONMALLOC": "malloc"}
        done = subprocess.run([sys.executable, __file__, "--inputs", str(args.inputs), "--module", str(module)],
                              env=env)
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
