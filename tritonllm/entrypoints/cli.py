"""`tritonllm serve [PATH] [flags]`: the OpenAI-compatible server, as `vllm serve`.

Every `LLM(...)` argument is a kebab-case flag (`--max-model-len`, `--enable-prefix-caching` /
`--no-enable-prefix-caching`, ...), generated from `LLM.__init__`'s signature so the two never drift.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import logging
import signal
import sys
import threading
import types
import typing
from typing import Any

from tritonllm.entrypoints.llm import LLM
from tritonllm.entrypoints.openai.limits import API_KEY_ENV, ServerLimits, api_key_from, is_loopback

logger = logging.getLogger(__name__)
DEFAULT_SERVED_NAME = "tiny-llama"  # when no PATH is given: the built-in random-weight Llama


def llm_parameters() -> list[inspect.Parameter]:
    """LLM's keyword arguments that become flags (`model` is the positional PATH), annotations resolved."""
    hints = typing.get_type_hints(LLM.__init__)
    params = inspect.signature(LLM.__init__).parameters.values()
    return [p.replace(annotation=hints[p.name]) for p in params if p.name not in ("self", "model")]


def _value_type(annotation: Any) -> type:
    """int for `int` or `int | None`; one concrete type per flag."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return typing.get_origin(annotation) or annotation


def _mapping(text: str) -> dict[str, str]:
    """`--kernels attention=torch_ref,rms_norm=triton` -> {"attention": "torch_ref", "rms_norm": "triton"}."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(pair) != 2 or not all(pair) for pair in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE[,KEY=VALUE...]")
    return dict(pairs)


def add_llm_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine", "the LLM(...) constructor's arguments, as kebab-case flags")
    for param in llm_parameters():
        flag = "--" + param.name.replace("_", "-")
        value_type = _value_type(param.annotation)
        if value_type is bool:
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=param.default, help="LLM(%(dest)s=)"
            )
        elif value_type is dict:
            group.add_argument(
                flag, type=_mapping, default=param.default, metavar="KEY=VALUE,...", help="LLM(%(dest)s=)"
            )
        else:
            metavar = value_type.__name__.upper()
            group.add_argument(flag, type=value_type, default=param.default, metavar=metavar, help="LLM(%(dest)s=)")


def llm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags as `LLM(**kwargs)` arguments (PATH as `model`)."""
    return {"model": args.model, **{p.name: getattr(args, p.name) for p in llm_parameters()}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritonllm", description="tritonllm: Triton-kernel LLM inference")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description="Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument(
        "model", nargs="?", default=None, metavar="PATH", help="HF model folder; None: the tiny built-in Llama"
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to bind")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--api-key", default=None,
                       help=f"every /v1/* route needs 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")  # fmt: skip
    defaults = ServerLimits()
    serve.add_argument("--max-request-body-bytes", type=int, default=defaults.max_request_body_bytes,
                       help="larger request bodies are refused (413)")  # fmt: skip
    serve.add_argument("--max-n", type=int, default=defaults.max_n, help="the largest n / best_of accepted")
    serve.add_argument("--max-prompts-per-request", type=int, default=defaults.max_prompts_per_request,
                       help="the most prompts in one completions request")  # fmt: skip
    serve.add_argument("--max-waiting-requests", type=int, default=defaults.max_waiting_requests,
                       help="requests waiting to start beyond this are refused with 503 and Retry-After")  # fmt: skip
    serve.add_argument("--request-timeout", type=float, default=None,
                       help="seconds a request may run before it is aborted (408); default: no limit")  # fmt: skip
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="on SIGTERM/SIGINT: seconds in-flight requests get to finish before they are aborted")  # fmt: skip
    serve.add_argument("--served-model-name", default=None, help="the `model` clients ask for; None: PATH")
    serve.add_argument("--gil-switch-interval", type=float, default=None, metavar="MS",
                       help="sys.setswitchinterval in milliseconds: how long the HTTP thread may hold the GIL while "
                            "the engine thread waits for it; default: Python's (5 ms)")  # fmt: skip
    serve.add_argument(
        "--uvicorn-log-level", default="info", choices=["debug", "info", "warning", "error"], help="uvicorn's log level"
    )
    add_llm_flags(serve)
    return parser


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    try:
        import uvicorn  # noqa: F401  (checked before the model loads)

        from tritonllm.entrypoints.openai.app import build_app  # noqa: F401
    except ImportError as e:
        parser.error(f"the server needs its extras ({e.name} is missing): pip install -e '.[server]'")
    configure_logging()
    if args.gil_switch_interval is not None:
        if args.gil_switch_interval <= 0:
            parser.error(f"--gil-switch-interval must be positive, not {args.gil_switch_interval}")
        sys.setswitchinterval(args.gil_switch_interval / 1000)
    try:
        limits = ServerLimits(
            api_key=api_key_from(args.api_key), max_request_body_bytes=args.max_request_body_bytes, max_n=args.max_n,
            max_prompts_per_request=args.max_prompts_per_request, max_waiting_requests=args.max_waiting_requests,
            request_timeout_s=args.request_timeout,
        )  # fmt: skip
        llm = LLM(**llm_kwargs(args))
    except ValueError as e:  # a bad flag value: say which, with usage
        parser.error(str(e))
    name = args.served_model_name or args.model or DEFAULT_SERVED_NAME
    serve_llm(llm, name, args.host, args.port, args.uvicorn_log_level, limits, args.shutdown_timeout)


def configure_logging() -> None:
    """INFO logs with the current HTTP request's id on every line (`-` outside a request)."""
    from tritonllm.entrypoints.openai.middleware import RequestIdFilter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())


def serve_llm(
    llm: LLM, name: str, host: str, port: int, log_level: str, limits: ServerLimits | None = None,
    shutdown_timeout_s: float = 30.0,
) -> None:  # fmt: skip
    """Serve `llm` over the OpenAI API until the server stops (the CLI's `serve` and the `serve`
    workload of `python -m tritonllm.run`). SIGTERM / SIGINT: uvicorn stops accepting connections and
    gives in-flight requests `shutdown_timeout_s` to finish, then cancels them (which aborts their
    engine requests); the engine thread stops, every request it still holds is aborted and its KV
    blocks freed, and the process exits 0."""
    from tritonllm.engine.async_engine import AsyncLLMEngine
    from tritonllm.entrypoints.openai.app import build_app

    limits = limits or ServerLimits(api_key=api_key_from(None))
    if limits.api_key is None and not is_loopback(host):
        logger.warning(
            "serving on %s without an API key: anyone who can reach this address can use the model "
            "(set --api-key or $%s, or bind 127.0.0.1)", host, API_KEY_ENV,
        )  # fmt: skip
    engine = AsyncLLMEngine(llm.llm_engine)
    try:
        run_server(build_app(engine, name, limits), host=host, port=port, log_level=log_level,
                   timeout_graceful_shutdown=shutdown_timeout_s)  # fmt: skip
    finally:
        engine.shutdown()
        leaked = llm.llm_engine.has_unfinished_requests()
        logger.info("server stopped%s", "; requests were left unfinished" if leaked else "")


def run_server(app, **config: Any) -> None:
    """uvicorn, but a SIGTERM / SIGINT ends it with exit status 0 once it has drained: uvicorn's own
    signal capture re-raises the signal after shutdown, so the process died by the signal."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

    Server(uvicorn.Config(app, **config)).run()


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args, parser)


if __name__ == "__main__":
    main()
