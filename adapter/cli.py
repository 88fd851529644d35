"""`rethink-mn`: the command line of the Message Node.

Exit codes: 0 success, 1 failure at run time, 2 bad usage, 3 bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvloop
from rich.console import Console

from .config import ConfigError, NodeConfig, load_config
from .private_files import PRIVATE_UMASK

if TYPE_CHECKING:
    from .localstack.nodes import NodesOptions
    from .localstack.up import WorkerOptions

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CONFIG = 0, 1, 2, 3
# Commands whose output is meant to be shared (aggregates, a report page): they keep the caller's
# umask. Every other command runs under PRIVATE_UMASK, see main().
SHARED_OUTPUT_COMMANDS = frozenset({"analyze", "dashboard"})

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _say(message: str) -> None:
    err.print(f"[bold cyan]rethink-mn[/]: {message}")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rethink-mn", description="reTHINK Message Node on a Matrix homeserver"
    )
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=Path("config.yaml"),
        help="configuration file (default: ./config.yaml)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_generate_registration(sub)

    db = sub.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up_cmd = db_sub.add_parser("upgrade", help="apply migrations (default: to the newest)")
    up_cmd.add_argument("revision", nargs="?", default="head")
    db_sub.add_parser("current", help="show the database's migration revision")

    run = sub.add_parser("run", help="run the node against the configured homeserver")
    run.add_argument(
        "--process",
        metavar="NAME",
        help="this process's name among the domain's node processes (cluster.process; also "
        "RETHINK_MN_PROCESS)",
    )

    from .policies.cli import add_parser as add_policy_parser

    add_policy_parser(sub)

    _add_data_commands(sub)
    _add_up(sub)
    return parser


def _add_generate_registration(sub: Any) -> None:
    gen = sub.add_parser(
        "generate-registration",
        help="write a Synapse appservice registration with fresh tokens; create or update the "
        "config to match",
    )
    gen.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("registration.yaml"),
        help="registration file to write (default: ./registration.yaml)",
    )
    gen.add_argument(
        "--url", help="URL the homeserver uses to reach the node (appservice.public_url)"
    )
    gen.add_argument("--homeserver-url", help="homeserver client-server API URL (homeserver.url)")
    gen.add_argument("--server-name", help="homeserver server name (homeserver.server_name)")
    gen.add_argument("--domain", help="reTHINK domain served by the node (domain)")


def _add_data_commands(sub: Any) -> None:
    """export, analyze and dashboard: what the node's rooms hold, as data."""
    export = sub.add_parser(
        "export", help="write the rooms' events as a Parquet dataset (incremental)"
    )
    export.add_argument("--out", type=Path, required=True, help="dataset directory")
    export.add_argument("--page-size", type=int, default=500, help="events per request (500)")
    export.add_argument("--quiet", action="store_true", help="no progress display")

    analyze = sub.add_parser(
        "analyze", help="run the Spark job over an export: Parquet aggregates and summary.json"
    )
    analyze.add_argument("--input", required=True, help="export directory (from `export`)")
    analyze.add_argument("--output", required=True, help="directory for the aggregates")
    analyze.add_argument("--master", help="Spark master (default local[*])")
    analyze.add_argument("--shuffle-partitions", type=int, help="Spark shuffle partitions")
    analyze.add_argument("--top-n", type=int, help="top talkers kept per kind (20)")

    dashboard = sub.add_parser(
        "dashboard",
        help="draw the ops dashboard as one HTML file (a running node serves it live at "
        "/dashboard)",
    )
    dashboard.add_argument("--input", required=True, type=Path, help="aggregates directory")
    dashboard.add_argument("--out", required=True, type=Path, help="HTML file to write")
    dashboard.add_argument("--domain", help="your domain: adds the federation panel")


def _add_up(sub: Any) -> None:
    up = sub.add_parser(
        "up", help="run everything locally: install and start Synapse, migrate, run the node"
    )
    up.add_argument(
        "--state-dir",
        type=Path,
        default=Path("var"),
        help="where the local homeserver, registration and database live (./var)",
    )
    up.add_argument(
        "--two-domains",
        action="store_true",
        help="two reTHINK domains (a.localhost, b.localhost), each with its Synapse and node, "
        "federating over loopback (configs under <state-dir>/domain-a|b/)",
    )
    up.add_argument(
        "--nodes",
        type=_node_count,
        metavar="N",
        help="the domain on N node processes sharing the stub port, on the local PostgreSQL; "
        "its own config under <state-dir>/nodes/ (<state-dir>/nodes-workers/ with --workers)",
    )
    up.add_argument(
        "--node-database",
        metavar="URL",
        help="with --nodes: the nodes' PostgreSQL database, created if missing "
        "(default postgresql://postgres@127.0.0.1:5432/rethink_mn_nodes, "
        "rethink_mn_nodes_workers with --workers)",
    )
    up.add_argument(
        "--workers",
        action="store_true",
        help="Synapse in worker mode (event persisters and the appservice push on workers) on "
        "PostgreSQL and Redis; its own config under <state-dir>/workers/",
    )
    up.add_argument(
        "--homeserver-database",
        metavar="URL",
        help="with --workers: Synapse's PostgreSQL database, created if missing "
        "(default postgresql://postgres@127.0.0.1:5432/rethink_mn_synapse, "
        "rethink_mn_synapse_nodes with --nodes)",
    )
    up.add_argument(
        "--redis",
        type=_host_port,
        metavar="HOST:PORT",
        help="with --workers: the Redis the workers replicate over (default 127.0.0.1:6379)",
    )


def _node_count(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise argparse.ArgumentTypeError(f"takes a number of processes from 1 to 64, not {value!r}")
    return int(value)


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"takes HOST:PORT, not {value!r}")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "up" and not args.workers and (args.homeserver_database or args.redis):
        parser.error("--homeserver-database and --redis go with --workers")
    if args.command == "up" and args.workers and args.two_domains:
        parser.error("--workers and --two-domains do not go together (yet)")
    if args.command == "up" and args.nodes and args.two_domains:
        parser.error("--nodes and --two-domains do not go together (yet)")
    if args.command == "up" and args.node_database and not args.nodes:
        parser.error("--node-database goes with --nodes")
    if args.command not in SHARED_OUTPUT_COMMANDS:
        # Group and others get nothing of what this process creates. The writers of secrets
        # create their files 0600 themselves; the umask covers what they do not write
        # themselves: the node's SQLite database when SQLite creates it (its -wal/-shm/-journal
        # files then take its mode), Synapse under `up` (a child inherits the umask: its own
        # database, media, log, signing key), an export of the rooms' messages, and anything a
        # library writes. One process-wide setting, made before any file is opened, leaves no
        # writer to forget and no window between a create and a chmod.
        os.umask(PRIVATE_UMASK)
    try:
        # uvloop: several times cheaper wake-ups between the loop and the database thread.
        return uvloop.run(_dispatch(args))
    except ConfigError as exc:
        err.print(f"[bold red]configuration error[/]: {exc}")
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_OK


async def _dispatch(args: argparse.Namespace) -> int:
    from .localstack.synapse import LocalStackError

    try:
        if args.command == "generate-registration":
            return _generate_registration(args)
        if args.command == "db":
            return await _db(args, load_config(args.config))
        if args.command == "run":
            environ = dict(os.environ)
            if args.process:
                environ["RETHINK_MN_PROCESS"] = args.process
            return await _run(args.config, load_config(args.config, environ))
        if args.command == "policy":
            from .policies import cli as policy_cli

            return await policy_cli.run(args, load_config(args.config), err)
        if args.command == "analyze":
            return await _analyze(args)
        if args.command == "dashboard":
            from .analytics import dashboard

            argv = ["--aggregates", str(args.input), "--out", str(args.out)]
            if args.domain:
                argv += ["--domain", args.domain]
            return await asyncio.to_thread(dashboard.main, argv)
        if args.command == "export":
            return await _export(args, load_config(args.config))
        if args.command == "up":
            from .localstack.nodes import up_nodes
            from .localstack.up import up, up_two_domains

            _configure_logging_for_up(args)
            if args.two_domains:
                return await up_two_domains(args.state_dir, _say)
            if args.nodes:
                return await up_nodes(
                    args.state_dir, _say, _nodes_options(args), _worker_options(args)
                )
            return await up(args.config, args.state_dir, _say, _worker_options(args))
    except LocalStackError as exc:
        err.print(f"[bold red]error[/]: {exc}")
        return EXIT_FAILURE
    raise AssertionError(f"unhandled command {args.command}")


def _nodes_options(args: argparse.Namespace) -> NodesOptions:
    from .localstack.nodes import NODES_WORKERS_DATABASE, NodesOptions

    options = NodesOptions(args.nodes)
    if args.node_database:
        return dataclasses.replace(options, database_url=args.node_database)
    if args.workers:
        return dataclasses.replace(options, database_url=NODES_WORKERS_DATABASE)
    return options


def _worker_options(args: argparse.Namespace) -> WorkerOptions | None:
    from .localstack.nodes import NODES_WORKERS_HOMESERVER_DATABASE
    from .localstack.up import WorkerOptions

    if not args.workers:
        return None
    options = WorkerOptions()
    if args.nodes:
        options = dataclasses.replace(options, database_url=NODES_WORKERS_HOMESERVER_DATABASE)
    if args.homeserver_database:
        options = dataclasses.replace(options, database_url=args.homeserver_database)
    if args.redis:
        host, port = args.redis
        options = dataclasses.replace(options, redis_host=host, redis_port=port)
    return options


def _configure_logging_for_up(args: argparse.Namespace) -> None:
    from .observability import configure_logging

    if args.config.exists():
        configure_logging(load_config(args.config).logging)
    else:
        from .config import LoggingConfig

        configure_logging(LoggingConfig())


def _generate_registration(args: argparse.Namespace) -> int:
    from .configfile import generate_registration

    overrides = {
        key: value
        for key, value in (
            ("appservice.public_url", args.url),
            ("homeserver.url", args.homeserver_url),
            ("homeserver.server_name", args.server_name),
            ("domain", args.domain),
        )
        if value is not None
    }
    config, warnings = generate_registration(args.config, args.output, overrides)
    _say(
        f"wrote {args.output} (appservice id {config.appservice.id!r}, "
        f"url {config.appservice.url}) and updated {args.config}"
    )
    for warning in warnings:
        err.print(f"[yellow]warning[/]: {warning}")
    _say("add the registration to the homeserver's app_service_config_files and restart it")
    return EXIT_OK


async def _db(args: argparse.Namespace, config: NodeConfig) -> int:
    from .storage import migrate

    url = config.database.url
    if args.db_command == "upgrade":
        await migrate.upgrade(url, args.revision)
        _say(f"database at revision {await migrate.current_revision(url)}")
        return EXIT_OK
    current = await migrate.current_revision(url)
    head = migrate.head_revision()
    state = "up to date" if current == head else f"behind (newest is {head})"
    print(current or "none")
    _say(f"revision {current or 'none'}: {state}")
    return EXIT_OK


async def _analyze(args: argparse.Namespace) -> int:
    # Imported here: only this command needs Spark (and a JVM).
    from .analytics import job

    argv = ["--input", args.input, "--output", args.output]
    for flag, value in (
        ("--master", args.master),
        ("--shuffle-partitions", args.shuffle_partitions),
        ("--top-n", args.top_n),
    ):
        if value is not None:
            argv += [flag, str(value)]
    # Spark drives its JVM with blocking calls: off the event loop.
    return int(await asyncio.to_thread(job.main, argv))


async def _export(args: argparse.Namespace, config: NodeConfig) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from appservice.api import HomeserverUnreachable, MatrixError

    from .export.runner import export

    if not 1 <= args.page_size <= 1000:
        err.print("[bold red]error[/]: --page-size must be between 1 and 1000")
        return EXIT_USAGE
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        disable=args.quiet,
    ) as bar:
        task = bar.add_task("reading rooms", total=None)

        def show(room: str, events: int) -> None:
            bar.update(task, description=f"{room}: {events} events")

        try:
            summary = await export(config, args.out, page_size=args.page_size, progress=show)
        except (HomeserverUnreachable, MatrixError) as exc:
            err.print(f"[bold red]error[/]: the homeserver refused or is unreachable: {exc}")
            return EXIT_FAILURE
    result = summary.as_dict()
    _say(
        f"exported {result['events']} events from {result['rooms']} rooms: "
        f"{result['message_rows']} message rows, {result['receipt_rows']} receipt rows "
        f"into {args.out}"
    )
    if result["undecodable_total"]:
        err.print(
            f"[yellow]warning[/]: {result['undecodable_total']} events could not be "
            f"decoded and were skipped: {result['undecodable']}"
        )
    return EXIT_OK


def _make_node_files_private(config_path: Path, config: NodeConfig) -> None:
    """What `run` keeps secrets in, owner-only: the configuration (tokens), the SQLite database
    (the session-signing secret) with its side files and, when the database is under it, the
    default state directory `./var` with everything in it (as `up` makes it). New files are
    created so; this tightens an install from before that, and logs what it changed."""
    import structlog

    from .private_files import describe, tighten_all, tighten_tree
    from .storage.database import sqlite_files

    log = structlog.get_logger("adapter.cli")
    changed: list[Path] = []
    problems: list[str] = []
    database = sqlite_files(config.database.url)
    state_dir = Path("var")
    if database and database[0].resolve().is_relative_to(state_dir.resolve()):
        changed, problems = tighten_tree(state_dir)
    more, more_problems = tighten_all([config_path, *database])
    changed += more
    if changed:
        log.warning(
            "made files that other users could read owner-only",
            count=len(changed),
            paths=describe(changed),
        )
    for problem in problems + more_problems:
        log.warning("could not make a file owner-only", problem=problem)


async def _run(config_path: Path, config: NodeConfig) -> int:
    from .heap import freeze_start_up_objects
    from .node import Node
    from .observability import configure_logging
    from .storage import migrate

    configure_logging(config.logging)
    await asyncio.to_thread(_make_node_files_private, config_path, config)
    current = await migrate.current_revision(config.database.url)
    if current != migrate.head_revision():
        err.print(
            f"[bold red]error[/]: database at revision {current or 'none'}, the node needs "
            f"{migrate.head_revision()}: run `rethink-mn db upgrade` first"
        )
        return EXIT_FAILURE
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node = Node(config)
    await node.start()
    freeze_start_up_objects()
    try:
        await stop.wait()
    finally:
        await node.stop()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
