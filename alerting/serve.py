"""``llmsla receiver``: compose policy, control client, journal and app from the configuration."""

from __future__ import annotations

import argparse
import asyncio
import signal

from llmsla.config import Config


def main(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.alerting import policy as policy_mod
    from llmsla.config import set_value
    from llmsla.errors import CliError
    from llmsla.yamlsrc import SourceError

    rc = cfg.receiver
    path = str(args.action_policy) if args.action_policy is not None else rc.action_policy
    try:
        pol = policy_mod.load(path or None)
    except SourceError as exc:
        raise CliError(str(exc)) from None
    if args.check_policy:
        print(f"{pol.source}: OK, {len(pol.rules)} rules ({', '.join(r.name for r in pol.rules)})")
        return 0
    if args.host is not None:
        rc.host = args.host
    if args.port is not None:
        rc.port = args.port
    if args.control_url:  # the check control.urls declares, as in the file
        set_value(cfg, "control.urls", list(args.control_url), "--control-url")
    asyncio.run(_run(cfg, pol, args.duration_s))
    return 0


async def _run(cfg: Config, pol, duration_s: float) -> None:  # noqa: ANN001 - Policy
    from llmsla.alerting.engine import Engine
    from llmsla.alerting.journal import PgJournal
    from llmsla.alerting.receiver import make_app
    from llmsla.control_client import ControlClient
    from llmsla.errors import CliError
    from llmsla.httpkit import Limits, serve
    from llmsla.store import open_store

    rc = cfg.receiver
    # idempotency keys, target state and the audit live in the store (the embedded PostgreSQL
    # unless store.dsn is set), so a restarted receiver resumes where it was
    store = await asyncio.to_thread(open_store, cfg)
    journal = PgJournal(store.dsn)
    try:
        await journal.check()
    except Exception as exc:  # noqa: BLE001 - any store failure is a startup error with its reason
        raise CliError(f"receiver store: {exc}") from None
    if not rc.token:
        print("llmsla receiver: receiver.token is empty - every webhook post will be refused (503)", flush=True)
    if not cfg.control.token:
        print("llmsla receiver: control.token is empty - the control API will refuse every action", flush=True)
    control = ControlClient(cfg.control.client_urls(), cfg.control.token, timeout_s=rc.control_timeout_s,
                            retries=rc.control_retries, backoff_s=rc.control_backoff_s)
    engine = Engine(pol, control, journal)
    limits = Limits.from_config(cfg)
    app = make_app(engine, token=rc.token, max_body=rc.max_body_bytes, tick_s=rc.tick_s,
                   prune_after_s=cfg.store.retention_days * 86400.0, limits=limits)
    served = await serve(app, rc.host, rc.port, limits)
    print(f"llmsla receiver on {served.url}/v1/alerts (policy {pol.source}, "
          f"control {', '.join(cfg.control.client_urls())}, {'store' if journal.durable else 'memory'} journal)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if duration_s > 0:
            await asyncio.wait_for(stop.wait(), duration_s)
        else:
            await stop.wait()
    except TimeoutError:
        pass
    finally:
        await served.stop()
        await control.close()
        await journal.close()
        store.close()  # last: an embedded server this receiver started stops with it
