"""The timing figures beside the loss and beside the cache: TensorBoard scalars written by
the timer (torch's SummaryWriter, a folder, make_loader, Lightning's logger), read back
with the tensorboard package's EventAccumulator; and the Pushgateway publisher against a
small HTTP server on loopback (what it pushes, where, from which thread, and a gateway
that is down)."""

from __future__ import annotations

import http.server
import logging
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hotcache.adapters import data_root, dataroot, make_loader, timed
from hotcache.adapters.pushgateway import Pushgateway

from .helpers import FakeClock, make_jpegs, read_scalars, write_hot_copy

torch = pytest.importorskip("torch")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402


class Source:
    """Batches that each arrive `delay` seconds late on the fake clock; one epoch per
    iteration, `n` batches."""

    def __init__(self, clock: FakeClock, n: int, delay: float):
        self.clock, self.n, self.delay = clock, n, delay

    def __iter__(self):
        for i in range(self.n):
            self.clock.sleep(self.delay)
            yield i


def train(timer, clock, step_s):
    for _ in timer:
        clock.sleep(step_s)


@pytest.fixture(autouse=True)
def no_data_root(monkeypatch):
    """Each test starts with no data root resolved in the process."""
    monkeypatch.setattr(dataroot, "_current", None)
    monkeypatch.delenv("HOTCACHE_TENSORBOARD", raising=False)
    monkeypatch.delenv("HOTCACHE_PUSHGATEWAY", raising=False)


def test_windows_and_epochs_at_the_global_step(tmp_path):
    """7 batches per epoch, a window every 3: windows end at batches 3 and 6 of each
    epoch, the epoch at its last batch, and the second epoch's steps go on from the
    first's (7 + ...). Waits of 20 ms per 5 ms step in the first epoch (80 % waiting),
    5 ms per 15 ms in the second (25 %)."""
    clock = FakeClock()
    source = Source(clock, 7, 0.020)
    writer = SummaryWriter(str(tmp_path))
    timer = timed(source, log_every=3, clock=clock, tensorboard=writer)
    train(timer, clock, 0.005)
    source.delay = 0.005
    train(timer, clock, 0.015)
    writer.close()
    got = read_scalars(tmp_path)
    assert [s for s, _ in got["input/wait_p50_ms"]] == [3, 6, 10, 13]
    assert [s for s, _ in got["input/epoch/wait_p50_ms"]] == [6, 13]
    assert [v for _, v in got["input/wait_p95_ms"]] == pytest.approx([20, 20, 5, 5])
    assert [v for _, v in got["input/epoch/waiting_share"]] == pytest.approx(
        [s.wait_share for s in timer.summaries])
    assert [v for _, v in got["input/epoch/waiting_share"]] == pytest.approx([0.8, 0.25], abs=0.03)
    # No data root resolved and no tiered reads: nothing says what was hot.
    assert "input/hot_fraction" not in got and "input/epoch/hot_fraction" not in got


def test_hot_fraction_follows_the_data_root(tmp_path):
    """1 where the process's data root is a verified hot copy, 0 where it is cold."""
    make_jpegs(tmp_path / "src", per_class=1)
    write_hot_copy(tmp_path / "src", tmp_path / "hot")
    clock = FakeClock()
    for where, want in (("hot", 1.0), ("src", 0.0)):
        data_root(tmp_path / where)
        folder = tmp_path / f"tb-{where}"
        train(timed(Source(clock, 4, 0.01), log_every=0, clock=clock, tensorboard=folder), clock, 0.01)
        assert read_scalars(folder)["input/epoch/hot_fraction"] == [(3, want)], where


def test_a_folder_is_written_and_flushed_at_each_epoch_end(tmp_path, monkeypatch):
    """A folder named by argument or by HOTCACHE_TENSORBOARD: the timer opens its own
    writer there, and an epoch's scalars are on disk when the epoch ends, while the
    writer is still open: 6 windows and the epoch."""
    clock = FakeClock()
    by_argument = timed(Source(clock, 7, 0.01), log_every=1, clock=clock, tensorboard=tmp_path / "a")
    train(by_argument, clock, 0.01)
    monkeypatch.setenv("HOTCACHE_TENSORBOARD", str(tmp_path / "b"))
    by_environment = timed(Source(clock, 7, 0.01), log_every=1, clock=clock)
    train(by_environment, clock, 0.01)
    for folder in ("a", "b"):
        got = read_scalars(tmp_path / folder)
        assert sorted(got) == ["input/epoch/wait_p50_ms", "input/epoch/wait_p95_ms",
                               "input/epoch/waiting_share", "input/wait_p50_ms",
                               "input/wait_p95_ms", "input/waiting_share"]
        assert got["input/epoch/wait_p50_ms"] == [(6, pytest.approx(10.0))]
    for timer in (by_argument, by_environment):       # open until here
        timer.sinks[0].close()
    # "" turns it off whatever the environment says
    assert timed([1], tensorboard="").sinks == []


def test_tensorboards_own_writer_and_a_wrong_target(tmp_path):
    from tensorboard.summary import Writer

    clock = FakeClock()
    writer = Writer(str(tmp_path))
    train(timed(Source(clock, 3, 0.01), log_every=0, clock=clock, tensorboard=writer), clock, 0.01)
    writer.close()
    assert read_scalars(tmp_path)["input/epoch/wait_p95_ms"] == [(2, pytest.approx(10.0))]
    with pytest.raises(TypeError, match="tensorboard="):
        timed([1], tensorboard=object())


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    root = tmp_path_factory.mktemp("publish") / "data"
    make_jpegs(root, per_class=5)        # 15 images
    return root


def test_make_loader_writes_them(jpegs, tmp_path):
    """make_loader(tensorboard=...): two epochs of 3 batches, a window every batch."""
    loader = make_loader(jpegs, batch_size=5, image_size=(8, 8), num_workers=0, log_every=1,
                         tensorboard=tmp_path)
    for _ in range(2):
        for _batch in loader:
            pass
    got = read_scalars(tmp_path)
    assert [s for s, _ in got["input/wait_p50_ms"]] == [1, 2, 4, 5]
    assert [s for s, _ in got["input/epoch/wait_p50_ms"]] == [2, 5]
    assert [v for _, v in got["input/epoch/wait_p95_ms"]] == pytest.approx(
        [s.p95_wait_s * 1e3 for s in loader.summaries])
    # Rebuilt from its attributes (as Lightning does), it publishes through the same sinks.
    assert loader.tensorboard == "" and loader.sinks is loader.timer.sinks and len(loader.sinks) == 1


def fit_with_lightning(tmp_path, loader, monitor, epochs=2):
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import TensorBoardLogger

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3 * 8 * 8, 3)

        def training_step(self, batch, _index):
            images, labels = batch
            loss = torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1) / 255), labels)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = TensorBoardLogger(str(tmp_path), name="run")
    trainer = lightning.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=logger,
                                callbacks=[monitor], log_every_n_steps=1,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
    trainer.fit(Tiny(), train_dataloaders=loader)
    logger.experiment.flush()
    return trainer, read_scalars(logger.log_dir)


def test_lightning_logs_them_through_the_trainers_logger(jpegs, tmp_path):
    """DataWaitMonitor over a make_loader loader: the loader's own figures, in the
    trainer's TensorBoardLogger, at the trainer's global step, beside the loss."""
    from hotcache.adapters import DataWaitMonitor

    loader = make_loader(jpegs, batch_size=5, image_size=(8, 8), num_workers=0, log_every=1)
    monitor = DataWaitMonitor()
    trainer, got = fit_with_lightning(tmp_path, loader, monitor)
    assert trainer.global_step == 6 and "loss" in got
    assert [(s.epoch, s.batches) for s in monitor.summaries] == [(0, 3), (1, 3)]
    epochs = got["input/epoch/wait_p50_ms"]
    assert [v for _, v in epochs] == pytest.approx([s.p50_wait_s * 1e3 for s in monitor.summaries])
    steps = [s for s, _ in epochs]
    assert len(steps) == 2 and steps[0] < steps[1] <= trainer.global_step
    windows = [s for s, _ in got["input/wait_p50_ms"]]
    assert len(windows) == 4 and windows == sorted(windows) and windows[-1] <= trainer.global_step
    assert loader.timer.sinks == []          # taken off again when training ends


def test_lightning_times_any_other_loader_from_its_hooks(tmp_path, monkeypatch):
    """Over a plain DataLoader the monitor times the loop from the hooks: one epoch
    summary per epoch, of all its batches, and a window per log_every batches. Each
    sample takes 20 ms to load on the fake clock, so each batch of 5 waits 100 ms."""
    from hotcache.adapters import DataWaitMonitor, lightning

    clock = FakeClock()
    monkeypatch.setattr(lightning, "perf_counter", clock)

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 15

        def __getitem__(self, index):
            clock.sleep(0.020)
            return torch.zeros(3, 8, 8, dtype=torch.uint8), 0

    monitor = DataWaitMonitor(log_every=2)
    trainer, got = fit_with_lightning(tmp_path, torch.utils.data.DataLoader(Slow(), batch_size=5), monitor)
    assert [s.batches for s in monitor.summaries] == [3, 3]
    assert [v for _, v in got["input/epoch/wait_p50_ms"]] == pytest.approx([100, 100])
    assert [v for _, v in got["input/epoch/waiting_share"]] == pytest.approx(
        [s.wait_share for s in monitor.summaries])
    assert [v for _, v in got["input/wait_p95_ms"]] == pytest.approx([100, 100])   # batch 3 of each epoch


# --- the Pushgateway --------------------------------------------------------------


class Gateway(http.server.ThreadingHTTPServer):
    """Records (method, path, body) of every request and answers 200."""

    def __init__(self):
        self.requests: list[tuple[str, str, str]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(handler):
                n = int(handler.headers.get("Content-Length") or 0)
                body = handler.rfile.read(n).decode() if n else ""
                self.requests.append((handler.command, handler.path, body))
                handler.send_response(200)
                handler.send_header("Content-Length", "0")
                handler.end_headers()

            do_PUT = do_DELETE = do_POST = _answer

            def log_message(handler, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def gateway():
    server = Gateway()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_pushes_the_figures_with_the_jobs_labels_and_deletes_its_group(gateway, tmp_path, monkeypatch):
    make_jpegs(tmp_path / "src", per_class=1)
    write_hot_copy(tmp_path / "src", tmp_path / "hot", name="imagenet", version="3")
    data_root(tmp_path / "hot")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("HOTCACHE_NODE", "gpu07.example.org")
    clock = FakeClock()
    pub = Pushgateway(gateway.url)
    train(timed(Source(clock, 5, 0.03), name="train", log_every=2, clock=clock, sinks=[pub]), clock, 0.01)
    pub.close()
    methods = [m for m, _, _ in gateway.requests]
    assert methods[0] == "PUT" and methods[-1] == "DELETE"
    assert {p for _, p, _ in gateway.requests} == {"/metrics/job/4242/rank/1"}
    body = [b for m, _, b in gateway.requests if m == "PUT"][-1]
    assert "# TYPE hotcache_input_waiting_ratio gauge" in body
    labels = {"loader": "train", "node": "gpu07", "dataset": "imagenet", "version": "3", "hot": "yes"}
    samples = {(s.name, s.labels.get("quantile")): (s.labels, s.value)
               for f in text_string_to_metric_families(body) for s in f.samples}
    want = {("hotcache_input_wait_seconds", "0.95"): 0.03, ("hotcache_input_wait_seconds", "0.5"): 0.03,
            # 4 waits of 30 ms in 4 steps of 40 ms and the last of 10 ms
            ("hotcache_input_waiting_ratio", None): 0.12 / 0.17, ("hotcache_input_hot_ratio", None): 1.0,
            ("hotcache_input_step", None): 4, ("hotcache_input_epoch", None): 0,     # the epoch's last batch
            ("hotcache_input_step_seconds", None): 0.17 / 5}
    assert set(samples) == set(want)
    for key, value in want.items():
        got_labels, got = samples[key]
        assert {k: v for k, v in got_labels.items() if k != "quantile"} == labels, key
        assert got == pytest.approx(value), key


def test_pushing_happens_off_the_training_thread(gateway, monkeypatch):
    """Every request goes out from the publisher's own thread; the training thread
    makes none."""
    threads = []
    real = urllib.request.urlopen

    def recording(req, *args, **kwargs):
        threads.append(threading.current_thread())
        return real(req, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", recording)
    clock = FakeClock()
    pub = Pushgateway(gateway.url, job="a/b")
    train(timed(Source(clock, 20, 0.01), log_every=2, clock=clock, sinks=[pub]), clock, 0.01)
    for _ in range(200):                  # until the thread has pushed (10 s at most)
        if gateway.requests:
            break
        threading.Event().wait(0.05)
    assert threads and all(t is pub._thread for t in threads)
    pub.close()
    # a job name with a slash goes into the path in the gateway's base64 form
    assert gateway.requests[0][1] == "/metrics/job@base64/YS9i/rank/0"


def test_a_gateway_that_is_down_never_fails_the_job_and_warns_once(caplog):
    server = Gateway()
    url = server.url
    server.server_close()                 # nothing listens there any more
    clock = FakeClock()
    pub = Pushgateway(url)
    with caplog.at_level(logging.WARNING, logger="hotcache.adapters"):
        for _ in range(3):
            train(timed(Source(clock, 9, 0.01), log_every=2, clock=clock, sinks=[pub]), clock, 0.01)
        pub.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and url in warnings[0].getMessage(), warnings
    assert pub.failures >= 2 and pub.pushes == 0


def test_the_argument_and_the_environment_turn_it_on(gateway, monkeypatch):
    from hotcache.adapters import pushgateway

    monkeypatch.setenv("HOTCACHE_PUSHGATEWAY", gateway.url)
    timer = timed([1, 2, 3], log_every=0)
    assert timer.sinks == [pushgateway.publisher(gateway.url)]
    assert timed([1], pushgateway="").sinks == []
    list(timer)
    pushgateway.publisher(gateway.url).close()
    assert [m for m, _, _ in gateway.requests][-1] == "DELETE"
