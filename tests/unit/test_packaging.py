"""Packaging checks: the server's optional parts fail with the extra to install, and the mesh's
Envoy protos and the OTLP exporter work together in one environment (xds-protos carries its own
copy of the OpenTelemetry protos, which must not be the one left installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.common.extras import EXTRAS, MissingExtra, require_extra


def test_envoy_protos_and_otlp_exporter_import_in_one_process() -> None:
    probe = (
        "from envoy.service.discovery.v3 import ads_pb2_grpc\n"
        "from envoy.config.trace.v3 import opentelemetry_pb2\n"
        "from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope\n"
        "from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter\n"
        "from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_missing_extra_names_the_extra_to_install() -> None:
    EXTRAS["no_such_module_here"] = ("bench", "no-such-package")
    try:
        with pytest.raises(MissingExtra) as raised:
            require_extra("no_such_module_here", "plotting a benchmark")
    finally:
        del EXTRAS["no_such_module_here"]
    message = str(raised.value)
    assert "plotting a benchmark needs no-such-package" in message
    assert "pip install 'tiermesh[bench]'" in message


def test_installed_extras_pass() -> None:
    for module in EXTRAS:
        require_extra(module, "a test")


def test_cli_reports_a_missing_extra_as_a_usage_error() -> None:
    """`tiermesh mesh serve` without xds-protos: exit 2 and the pip line, no traceback."""
    probe = (
        "import sys, importlib.util\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'envoy' else real(name, *a)\n"
        "from services.cli.main import main\n"
        "sys.exit(main(['mesh', 'serve', '--port', '0']))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "pip install 'tiermesh[mesh]'" in done.stderr
    assert "Traceback" not in done.stderr
