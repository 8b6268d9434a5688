"""OpenTelemetry tracing: a span per client request, a child span per upstream attempt.

The attempt span's context goes to the leader as a W3C `traceparent` header, so an engine that
traces too joins the same trace. With the exporter set to "none" (the default) no spans are
made at all: the request path checks `enabled` first and pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config import TracingConfig

__all__ = ["Span", "Tracing", "end_span"]

log = logging.getLogger("unitgate.tracing")
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    def __init__(self, config: TracingConfig, provider: TracerProvider | None = None) -> None:
        self._own_provider = provider is None and config.exporter != "none"
        if provider is None and config.exporter != "none":
            provider = TracerProvider(resource=Resource({"service.name": config.service_name}))
            provider.add_span_processor(BatchSpanProcessor(_exporter(config)))
        self.provider = provider
        self.enabled = provider is not None
        self.tracer = provider.get_tracer("unitgate") if provider is not None else None

    def request_span(self, name: str, headers: Mapping[str, str]) -> Span | None:
        """The server span of a client request, continuing the client's trace if it sent one."""
        if self.tracer is None:
            return None
        parent = _PROPAGATOR.extract(carrier=dict(headers))
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER)

    def attempt_span(self, parent: Span, unit_id: str, attempt: int) -> tuple[Span, str]:
        """A client span for one attempt at a unit, and the `traceparent` value to send."""
        assert self.tracer is not None
        context = trace.set_span_in_context(parent)
        span = self.tracer.start_span(
            "upstream attempt",
            context=context,
            kind=SpanKind.CLIENT,
            attributes={"unitgate.unit": unit_id, "unitgate.attempt": attempt},
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return span, carrier["traceparent"]

    def shutdown(self) -> None:
        if self._own_provider and self.provider is not None:
            self.provider.shutdown()


def end_span(span: Span, outcome: str, *, error: bool) -> None:
    span.set_attribute("unitgate.outcome", outcome)
    if error:
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()


def _exporter(config: TracingConfig) -> SpanExporter:
    if config.exporter == "console":
        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise RuntimeError(
            "[tracing].exporter = 'otlp' needs the package opentelemetry-exporter-otlp-proto-http"
        ) from exc
    endpoint = config.otlp_endpoint or None
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint)
    return exporter
