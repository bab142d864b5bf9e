"""``gantool bench serve``: a real `gantool serve` measured from outside (latency, throughput,
hostile clients, many holes, memory, crafted uploads); registered on ``gantool bench``."""

from __future__ import annotations

import json

import click

from gantool.cli.options import (
    backend_option,
    batch_wait_option,
    echo_table,
    max_batch_option,
    precision_option,
    provider_option,
)


# long: one click command whose options serve every mode (plain, --hostile, --holes, --memory, --crafted)
@click.command("serve")
@click.argument("model", required=False, metavar="[MODEL]")
@click.option("--requests", default=200, show_default=True, type=click.IntRange(min=1), help="Requests per round.")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rounds of --requests against one server; medians and ranges over the rounds are reported.",
)
@click.option(
    "--concurrency",
    default=8,
    show_default=True,
    type=click.IntRange(min=1),
    help="Client threads, each with one keep-alive connection.",
)
@click.option("--size", default=512, show_default=True, type=click.IntRange(min=8), help="Square image size.")
@provider_option
@backend_option
@precision_option
@max_batch_option
@batch_wait_option
@click.option(
    "--baseline-images",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Images for the in-process Inpainter throughput.",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=1800.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds for the whole run; no request starts after it.",
)
@click.option(
    "--hostile",
    is_flag=True,
    help="Rounds with and without --trickling slow clients (A, B, A, B), keep-alive /healthz, a 1,000-hole request.",
)
@click.option(
    "--trickling",
    default=16,
    show_default=True,
    type=click.IntRange(min=0),
    help="With --hostile: slow clients sending one byte a second.",
)
@click.option(
    "--holes",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Instead: --rounds of one request with N separate holes against one with one hole (--size).",
)
@click.option(
    "--memory",
    is_flag=True,
    help="Instead: per strategy, a fresh server limited to --concurrency slots and --size^2 pixels, its largest "
    "requests from every slot, peak RSS against the documented bound.",
)
@click.option(
    "--crafted",
    is_flag=True,
    help="Instead: --rounds of small crafted uploads (under 100 kB: huge 1-bit masks, thousands of holes, "
    "WebP too wide), the ms each costs the server before it answers.",
)
@click.option(
    "--url",
    "urls",
    multiple=True,
    metavar="URL",
    help="With --crafted: measure these running servers (repeatable, interleaved) instead of starting one.",
)
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Instead: gantool serve --ray at each --replicas count against plain serve, rounds interleaved, "
    "then one replica killed mid-round.",
)
@click.option(
    "--replicas",
    default="1,2",
    show_default=True,
    metavar="N,N,...",
    help="With --ray: the replica counts to measure.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_serve(
    model: str | None,
    as_json: bool,
    use_ray: bool,
    replicas: str,
    hostile: bool,
    trickling: int,
    holes: int,
    memory: bool,
    crafted: bool,
    urls: tuple[str, ...],
    **options,
) -> None:
    """Latency percentiles, images/s, errors and server memory of `gantool serve`
    on loopback, beside the in-process Inpainter's images/s on the same images."""
    from gantool.cli.serve_cmd import INSTALL_HINT, missing_serve_packages

    if missing_serve_packages():
        raise click.ClickException(INSTALL_HINT)
    if use_ray:
        _bench_serve_ray(model, as_json, replicas, options)
        return
    if crafted:
        _bench_serve_crafted(model, as_json, list(urls), options)
        return
    if hostile:
        _bench_serve_hostile(model, as_json, trickling, options)
        return
    if holes:
        _bench_serve_holes(model, as_json, holes, options)
        return
    if memory:
        _bench_serve_memory(model, as_json, options)
        return
    from gantool.tools.bench_serve import bench_serve as run

    result = run(model, **options)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return

    def mb(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0f}"

    lat, rss = result["latency_ms"], result["rss_mb"]

    def spread(key: str, digits: int = 2, unit: str = "") -> str:
        low, high = result[f"{key}_range"]
        return f"{result[key]:.{digits}f}{unit} ({low:.{digits}f}-{high:.{digits}f}{unit})"

    click.echo(
        f"serve benchmark: {result['model']} ({result['backend']} on {result['provider']}, "
        f"{result['cpu_count']} CPUs); {result['rounds']} round(s) of {result['requests']} requests of "
        f"{result['size']} px from {result['concurrency']} clients; max batch {result['max_batch']}, "
        f"wait {result['batch_wait_ms']:g} ms; medians over the rounds (min-max)"
    )
    echo_table(
        ["measure", "value"],
        [
            ["requests ok / errors", f"{result['ok']} / {result['errors']}"],
            ["latency p50 / p95 / p99 ms (all rounds)", f"{lat['p50']:.0f} / {lat['p95']:.0f} / {lat['p99']:.0f}"],
            ["images/s, server", spread("server_images_per_s")],
            [
                f"images/s, in-process Inpainter ({result['in_process_images']} images, "
                "measured before, between and after the rounds)",
                spread("in_process_images_per_s"),
            ],
            ["server / in-process (each round against the measurements beside it)", spread("ratio", unit="x")],
            [
                "images/s, in-process from PNG bytes to PNG bytes (the server's decode and encode)",
                f"{result['in_process_png_images_per_s']:.2f}",
            ],
            ["server / in-process with PNG decode and encode", f"{result['ratio_to_png_in_process']:.2f}x"],
            [
                "server RSS MB: ready / after 50 / after all",
                f"{mb(rss['ready'])} / {mb(rss['after_50'])} / {mb(rss['after_all'])}",
            ],
        ],
    )
    for example in result["error_examples"]:
        click.echo(f"error: {example}")
    goals = result["goals"]
    click.echo(
        f"goal >= {goals['throughput']['goal']:.2f}x in-process images/s with 0 errors: "
        f"{result['ratio']:.2f}x (median), {result['errors']} errors -> {'met' if goals['throughput']['met'] else 'NOT met'}"
    )
    growth = goals["rss_stable"]["growth"]
    click.echo(
        f"goal server RSS after all requests within {goals['rss_stable']['goal']:.0%} of after 50: "
        + ("n/a" if growth is None else f"{growth:+.1%}")
        + f" -> {'met' if goals['rss_stable']['met'] else 'NOT met'}"
    )


def _bench_serve_hostile(model: str | None, as_json: bool, trickling: int, options: dict) -> None:
    from gantool.tools.bench_hostile import bench_serve_hostile

    result = bench_serve_hostile(model, requests=options["requests"], concurrency=options["concurrency"],
                                 size=options["size"], trickling=trickling, rounds=options["rounds"],
                                 provider=options["provider"], backend=options["backend"],
                                 timeout_s=options["timeout_s"])  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    load = ", ".join(f"{v:.1f}" for v in result["load_average"])
    click.echo(f"serve --hostile benchmark: {result['requests']} requests of {result['size']} px from "
               f"{result['concurrency']} clients per round, {result['trickling']} trickling clients in B rounds; "
               f"{result['cpu_count']} CPUs, load average {load}")  # fmt: skip
    echo_table(["round", "images/s", "ok / errors", "p99 ms"], [
        ["B (trickling)" if row["hostile"] else "A (normal)", f"{row['images_per_s']:.2f}",
         f"{row['ok']} / {row['errors']}", f"{row['p99_ms']:.0f}"] for row in result["per_round"]
    ])  # fmt: skip
    goals, holes, healthz = result["goals"], result["holes"], result["healthz_keepalive_ms"]
    low, high = result["ratio_range"]
    met = {True: "met", False: "NOT met"}
    click.echo(f"goal B/A >= {goals['hostile_throughput']['goal']}x with 0 errors: {result['ratio']:.2f}x "
               f"({low:.2f}-{high:.2f}) -> {met[goals['hostile_throughput']['met']]}")  # fmt: skip
    click.echo(f"goal keep-alive /healthz median < {goals['healthz_keepalive']['goal_ms']:g} ms: "
               f"{healthz['median']:.2f} ms (p99 {healthz['p99']:.2f}) -> {met[goals['healthz_keepalive']['met']]}")  # fmt: skip
    click.echo(f"goal {holes['count']} holes within 2x one hole, or refused < 100 ms: one {holes['one_s'] * 1e3:.0f} ms, "
               f"{holes['count']} {holes['many_s'] * 1e3:.0f} ms (HTTP {holes['many_status']}) "
               f"-> {met[goals['many_holes']['met']]}")  # fmt: skip
    rss = result["rss_mb"]
    click.echo(f"server RSS MB: peak {rss['peak']}, after all {rss['after_all']}")


def _bench_serve_holes(model: str | None, as_json: bool, holes: int, options: dict) -> None:
    from gantool.tools.bench_limits import bench_serve_holes

    result = bench_serve_holes(model, size=options["size"], holes=holes, rounds=options["rounds"],
                               provider=options["provider"], backend=options["backend"],
                               timeout_s=options["timeout_s"])  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    load = "; ".join(", ".join(f"{v:.1f}" for v in result["load_average"][k]) for k in ("before", "after"))

    def ms(row: dict) -> str:
        return f"{row['median']:.1f} [{row['min']:.1f}-{row['max']:.1f}]"

    click.echo(f"serve --holes benchmark: {result['side']} x {result['side']} image, {result['rounds']} interleaved "
               f"rounds; {result['model']} ({result['backend']} on {result['provider']}); {result['cpu_count']} CPUs, "
               f"load average {load} (before; after)")  # fmt: skip
    statuses = result["statuses"]
    echo_table(["request or stage", "ms median [min-max]", "HTTP"], [
        ["one hole, end to end", ms(result["one_ms"]), "/".join(map(str, statuses["one"]))],
        [f"{result['holes']} holes, end to end", ms(result["many_ms"]), "/".join(map(str, statuses["many"]))],
        *([f"  in-process: {name}", ms(row), ""] for name, row in result["stages_ms"].items()),
    ])  # fmt: skip
    if result["many_answer"]:
        click.echo(f"answer: {result['many_answer']}")
    goal = result["goal"]
    click.echo(f"goal {result['holes']} holes within {goal['ratio']:g}x one hole, or refused in < {goal['refuse_ms']:g} ms "
               f"-> {'met' if goal['met'] else 'NOT met'}")  # fmt: skip


def _bench_serve_memory(model: str | None, as_json: bool, options: dict) -> None:
    from gantool.tools.bench_limits import bench_serve_memory

    pixels = options["size"] ** 2
    result = bench_serve_memory(model, max_queue=options["concurrency"], max_pixels=pixels, max_model_pixels=pixels,
                                max_upload_mb=max(8.0, 4.0 * pixels / 2**20), rounds=options["rounds"],
                                provider=options["provider"], backend=options["backend"],
                                timeout_s=options["timeout_s"])  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    load = "; ".join(", ".join(f"{v:.1f}" for v in result["load_average"][k]) for k in ("before", "after"))
    limits = result["limits"]
    click.echo(f"serve --memory benchmark: {result['model']} ({result['backend']} on {result['provider']}); "
               f"--max-queue {limits['max_queue']} --max-pixels {limits['max_pixels']} --max-model-pixels "
               f"{limits['max_model_pixels']} --max-upload-mb {limits['max_upload_mb']:g}; {result['rounds']} round(s) "
               f"of {limits['max_queue']} concurrent requests, blend none; {result['cpu_count']} CPUs, load average "
               f"{load} (before; after)")  # fmt: skip
    echo_table(["strategy", "request", "ok", "RSS MB ready / peak / after", "bound MB", "within"], [
        [row["strategy"], f"{row['side']} px, {row['holes']} holes, {row['windows']} windows, "
         f"{row['model_pixels']} model px", f"{row['ok']} / {row['requests']}",
         f"{row['ready_mb']:.0f} / {row['peak_mb']:.0f} / {row['after_mb']:.0f}", f"{row['bound_mb']['total']:.0f}",
         "yes" if row["within"] else "NO"] for row in result["per_strategy"]
    ])  # fmt: skip
    click.echo(f"goal peak RSS within the bound for every strategy, every request 200 -> "
               f"{'met' if result['met'] else 'NOT met'}")  # fmt: skip


def _bench_serve_crafted(model: str | None, as_json: bool, urls: list[str], options: dict) -> None:
    from gantool.tools.bench_crafted import bench_serve_crafted

    result = bench_serve_crafted(urls or None, model, rounds=options["rounds"], provider=options["provider"],
                                 backend=options["backend"], timeout_s=options["timeout_s"])  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"serve --crafted benchmark: {result['rounds']} rounds, each upload on a new connection, servers interleaved"
    )
    echo_table(
        ["server", "upload", "bytes", "status", "median ms", "min-max ms"],
        [[row["server"], row["case"], str(row["bytes"]), row["status"], f"{row['median_ms']:.0f}",
          f"{row['min_ms']:.0f}-{row['max_ms']:.0f}"] for row in result["rows"]],
    )  # fmt: skip
    goal = result["goal"]
    click.echo(f"goal: every refused upload under 100 kB answered within {goal['max_refused_median_ms']:.0f} ms "
               f"(median): worst {goal['measured']:.0f} ms -> {'met' if goal['met'] else 'NOT met'}")  # fmt: skip


def _cpu_cell(cpu_ms: dict[str, float] | None) -> str:
    """A server's CPU per image: the total, and under Ray its parts (plain serve is all "rest")."""
    if not cpu_ms:
        return "n/a"
    total = f"{sum(cpu_ms.values()):.0f}"
    if not cpu_ms["replicas"]:
        return total
    return f"{total} ({cpu_ms['replicas']:.0f} / {cpu_ms['proxy']:.0f} / {cpu_ms['rest']:.0f})"


def _bench_serve_ray(model: str | None, as_json: bool, replicas: str, options: dict) -> None:
    from gantool.tools.bench_serve_ray import bench_serve_ray

    try:
        counts = [int(n) for n in replicas.split(",") if n.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{replicas!r}: expected whole numbers separated by commas", param_hint="--replicas"
        ) from None
    result = bench_serve_ray(model, counts, requests=options["requests"], concurrency=options["concurrency"],
                             size=options["size"], rounds=options["rounds"], provider=options["provider"],
                             backend=options["backend"], precision=options["precision"],
                             max_batch=options["max_batch"], batch_wait_ms=options["batch_wait_ms"],
                             timeout_s=options["timeout_s"])  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    load = "; ".join(", ".join(f"{v:.1f}" for v in result["load_average"][k]) for k in ("before", "after"))
    click.echo(f"serve --ray benchmark: {result['rounds']} interleaved round(s) of {result['requests']} requests of "
               f"{result['size']} px from {result['concurrency']} clients per server; {result['cpu']}, "
               f"{result['cpu_count']} CPUs, load average {load} (before; after)")  # fmt: skip
    echo_table(["server", "images/s median (min-max)", "vs plain", "p50 / p99 ms", "ok / sent",
                "CPU ms/image (replicas / proxy / rest)", "start s"], [
        [row["server"], f"{row['images_per_s']:.2f} ({row['images_per_s_range'][0]:.2f}-{row['images_per_s_range'][1]:.2f})",
         f"{row['ratio']:.2f}x", f"{row['p50']:.0f} / {row['p99']:.0f}", f"{row['ok']} / {row['sent']}",
         _cpu_cell(row["cpu_ms_per_image"]), f"{row['startup_s']:.1f}"] for row in result["rows"]
    ])  # fmt: skip
    kill, goals = result["kill"], result["goals"]
    met = {True: "met", False: "NOT met"}
    first = kill["first_success_after_kill_s"]
    click.echo(f"goal {result['rows'][-1]['server']} >= {goals['throughput']['goal']}x plain serve: "
               f"{goals['throughput']['ratio']:.2f}x -> {met[goals['throughput']['met']]}")  # fmt: skip
    click.echo(f"goal one replica SIGKILLed mid-round: {kill['wrong']} wrong images, {kill['non_json']} non-JSON answers, "
               f"{kill['failed']} failed of {kill['sent']}, first success after the kill "
               f"{'never' if first is None else f'{first:.2f} s'}, p99 {kill['p99_ms']:.0f} ms = "
               f"{kill['p99_factor']:.2f}x undisturbed -> {met[goals['kill']['met']]}")  # fmt: skip
    click.echo(f"goal startup to ready < {goals['startup']['goal_s']:g} s: "
               + ", ".join(f"{row['server']} {row['startup_s']:.1f} s" for row in result["rows"])
               + f" -> {met[goals['startup']['met']]}")  # fmt: skip
