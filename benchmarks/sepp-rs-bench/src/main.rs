//! JSON-lines benchmark driver for sepp-rs, the twin of tests/peers/seppy_driver.py and
//! benchmarks/trio_driver.py: same ops, same semantics, same result fields. One request per
//! line on stdin, one `{"id", "ok", "result" | "error"}` line per request on stdout.
//!
//! It runs on a tokio *current-thread* runtime: one thread, like the Python clients, so CPU
//! per operation compares like with like (tonic spawns no threads of its own).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sepp_rs::client::SeppClient;
use sepp_rs::worker::Worker;
use sepp_rs::{EnqueueRequest, Payload, Primitive, ReserveOptions};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Semaphore};

type Res = Result<Value, String>;

fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn rss() -> Value {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: u64 = text
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    json!({"rss_bytes": kb * 1024})
}

fn arg_u64(req: &Value, key: &str, default: u64) -> u64 {
    req.get(key).and_then(Value::as_u64).unwrap_or(default)
}

fn arg_f64(req: &Value, key: &str, default: f64) -> f64 {
    req.get(key).and_then(Value::as_f64).unwrap_or(default)
}

fn arg_str(req: &Value, key: &str) -> Result<String, String> {
    req.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("missing string argument {key:?}"))
}

fn job(queue: &str, job_type: &str, payload_size: usize) -> Result<EnqueueRequest, String> {
    let r = EnqueueRequest::new(queue, job_type).map_err(|e| e.to_string())?;
    Ok(if payload_size > 0 {
        r.with_payload(Payload::new(
            vec![b'x'; payload_size],
            "application/octet-stream",
        ))
    } else {
        r
    })
}

fn measured(n: u64, t0: Instant, c0: f64) -> Value {
    json!({"elapsed_s": t0.elapsed().as_secs_f64(), "cpu_s": cpu_s() - c0, "n": n})
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((p / 100.0 * sorted.len() as f64).ceil() as usize).max(1);
    sorted[k.min(sorted.len()) - 1]
}

async fn bench_enqueue(client: &SeppClient, req: &Value) -> Res {
    let queue = arg_str(req, "queue")?;
    let n = arg_u64(req, "n", 0);
    let concurrency = arg_u64(req, "concurrency", 1).max(1).min(n.max(1));
    let size = arg_u64(req, "payload_size", 0) as usize;
    let remaining = Arc::new(AtomicUsize::new(n as usize));
    let (c0, t0) = (cpu_s(), Instant::now());
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, queue, remaining) = (client.clone(), queue.clone(), remaining.clone());
        tasks.push(tokio::spawn(async move {
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
                .is_ok()
            {
                client
                    .enqueue(job(&queue, "bench", size)?)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(measured(n, t0, c0))
}

async fn bench_enqueue_batch(client: &SeppClient, req: &Value) -> Res {
    let queue = arg_str(req, "queue")?;
    let n_batches = arg_u64(req, "n_batches", 0);
    let batch_size = arg_u64(req, "batch_size", 1);
    let concurrency = arg_u64(req, "concurrency", 1).max(1).min(n_batches.max(1));
    let size = arg_u64(req, "payload_size", 0) as usize;
    let remaining = Arc::new(AtomicUsize::new(n_batches as usize));
    let (c0, t0) = (cpu_s(), Instant::now());
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, queue, remaining) = (client.clone(), queue.clone(), remaining.clone());
        tasks.push(tokio::spawn(async move {
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
                .is_ok()
            {
                let batch = (0..batch_size)
                    .map(|_| job(&queue, "bench", size))
                    .collect::<Result<Vec<_>, _>>()?;
                let results = client
                    .enqueue_batch(batch)
                    .await
                    .map_err(|e| e.to_string())?;
                if results.iter().any(Result::is_err) {
                    return Err("a job was rejected during bench_enqueue_batch".to_string());
                }
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(measured(n_batches * batch_size, t0, c0))
}

async fn bench_drain_raw(client: &SeppClient, req: &Value) -> Res {
    let queue = arg_str(req, "queue")?;
    let n = arg_u64(req, "n", 0) as usize;
    let in_flight = arg_u64(req, "in_flight", 16).max(1) as usize;
    let lease = Duration::from_secs_f64(arg_f64(req, "lease_s", 30.0));
    let wait = Duration::from_secs_f64(arg_f64(req, "wait_s", 1.0));
    let info = client.get_server_info().await.map_err(|e| e.to_string())?;
    let max_batch = (info.max_reserve_batch as usize).max(1);
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut tasks = Vec::new();
    let mut reserved = 0usize;
    let (c0, t0) = (cpu_s(), Instant::now());
    while reserved < n {
        // Take every free slot (at least one), as the Python drivers do.
        let first = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let mut permits = vec![first];
        while permits.len() < (n - reserved).min(max_batch) {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let opts = ReserveOptions::new([queue.clone()], lease)
            .map_err(|e| e.to_string())?
            .with_wait_timeout(wait)
            .with_max_jobs(permits.len() as u32);
        let jobs = client
            .reserve(&opts)
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        reserved += jobs.len();
        for job in jobs {
            let permit = permits
                .pop()
                .ok_or("the server returned more jobs than asked")?;
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let r = client.ack(&job.ctx).await.map_err(|e| e.to_string());
                drop(permit);
                r
            }));
        }
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(measured(reserved as u64, t0, c0))
}

async fn bench_drain_worker(client: &SeppClient, req: &Value) -> Res {
    let queue = arg_str(req, "queue")?;
    let n = arg_u64(req, "n", 0) as usize;
    let lease = Duration::from_secs_f64(arg_f64(req, "lease_s", 30.0));
    let mut worker = Worker::new(client.clone(), [queue], lease)
        .map_err(|e| e.to_string())?
        .with_max_in_flight(arg_u64(req, "max_in_flight", 16) as usize)
        .with_wait_timeout(Duration::from_secs_f64(arg_f64(req, "wait_s", 5.0)));
    if req.get("auto_extend").and_then(Value::as_bool) == Some(true) {
        worker = worker.with_auto_extend();
    }
    let handle = worker.shutdown_handle();
    let done = Arc::new(AtomicUsize::new(0));
    let counter = done.clone();
    let worker = worker.with_catch_all_handler(move |_payload, _ctx| {
        let (counter, handle) = (counter.clone(), handle.clone());
        async move {
            if counter.fetch_add(1, Ordering::SeqCst) + 1 >= n {
                handle.shutdown();
            }
            Ok(())
        }
    });
    let (c0, t0) = (cpu_s(), Instant::now());
    worker.run().await;
    Ok(measured(done.load(Ordering::SeqCst) as u64, t0, c0))
}

async fn bench_latency(client: &SeppClient, req: &Value) -> Res {
    let queue = arg_str(req, "queue")?;
    let n = arg_u64(req, "n", 0) as usize;
    let warmup = arg_u64(req, "warmup", 0) as usize;
    let size = arg_u64(req, "payload_size", 16) as usize;
    let worker = Worker::new(
        client.clone(),
        [queue.clone()],
        Duration::from_secs_f64(arg_f64(req, "lease_s", 30.0)),
    )
    .map_err(|e| e.to_string())?
    .with_max_in_flight(arg_u64(req, "max_in_flight", 16) as usize)
    .with_wait_timeout(Duration::from_secs_f64(arg_f64(req, "wait_s", 30.0)));
    let handle = worker.shutdown_handle();
    let waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Instant>>>> = Arc::default();
    let table = waiting.clone();
    let worker = worker.with_catch_all_handler(move |_payload, ctx| {
        let now = Instant::now();
        let table = table.clone();
        async move {
            if let Some(Primitive::String(key)) = ctx.custom.get("lat_key") {
                if let Some(tx) = table.lock().unwrap().remove(key) {
                    let _ = tx.send(now);
                }
            }
            Ok(())
        }
    });
    let run = tokio::spawn(worker.run());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut samples = Vec::with_capacity(n);
    let pid = std::process::id();
    let mut failure = None;
    for i in 0..warmup + n {
        let key = format!("lat-{pid}-{i}");
        let (tx, rx) = oneshot::channel();
        waiting.lock().unwrap().insert(key.clone(), tx);
        let t0 = Instant::now();
        let request = job(&queue, "latency", size)?.with_custom_entry("lat_key", key.as_str());
        if let Err(e) = client.enqueue(request).await {
            failure = Some(e.to_string());
            break;
        }
        match tokio::time::timeout(Duration::from_secs(10), rx).await {
            Ok(Ok(t1)) => {
                if i >= warmup {
                    samples.push((t1 - t0).as_secs_f64() * 1000.0);
                }
            }
            _ => {
                failure = Some(format!("job {i} never reached the handler"));
                break;
            }
        }
    }
    handle.shutdown();
    let _ = run.await;
    if let Some(f) = failure {
        return Err(f);
    }
    let mut s = samples.clone();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = if s.is_empty() {
        f64::NAN
    } else {
        s.iter().sum::<f64>() / s.len() as f64
    };
    Ok(json!({
        "p50_ms": percentile(&s, 50.0),
        "p99_ms": percentile(&s, 99.0),
        "mean_ms": mean,
        "min_ms": s.first().copied().unwrap_or(f64::NAN),
        "max_ms": s.last().copied().unwrap_or(f64::NAN),
        "n": s.len(),
    }))
}

struct Driver {
    client: Option<SeppClient>,
}

impl Driver {
    fn client(&self) -> Result<&SeppClient, String> {
        self.client
            .as_ref()
            .ok_or_else(|| "send a 'connect' request first".to_string())
    }

    async fn handle(&mut self, op: &str, req: &Value) -> Res {
        match op {
            "ping" => Ok(json!({
                "pong": true,
                "sepp_rs_version": "0.1.0",
                "runtime": "tokio current_thread",
                "pid": std::process::id(),
            })),
            "connect" => {
                let addr = arg_str(req, "addr")?;
                let uri = if addr.contains("://") {
                    addr
                } else {
                    format!("http://{addr}")
                };
                self.client = Some(SeppClient::connect(uri).await.map_err(|e| e.to_string())?);
                Ok(json!({"connected": true}))
            }
            "close" | "shutdown" => {
                self.client = None;
                Ok(json!({}))
            }
            "rss" => Ok(rss()),
            "get_server_info" => {
                let info = self
                    .client()?
                    .get_server_info()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(json!({"version": info.version, "max_reserve_batch": info.max_reserve_batch}))
            }
            "bench_enqueue" => bench_enqueue(self.client()?, req).await,
            "bench_enqueue_batch" => bench_enqueue_batch(self.client()?, req).await,
            "bench_drain_raw" => bench_drain_raw(self.client()?, req).await,
            "bench_drain_worker" => bench_drain_worker(self.client()?, req).await,
            "bench_latency" => bench_latency(self.client()?, req).await,
            other => Err(format!("unknown op {other:?}")),
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut driver = Driver { client: None };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                let op = req
                    .get("op")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let reply = match rt.block_on(driver.handle(&op, &req)) {
                    Ok(v) => json!({"id": id, "ok": true, "result": v}),
                    Err(e) => json!({"id": id, "ok": false,
                                     "error": {"type": "DriverError", "message": e}}),
                };
                if op == "shutdown" {
                    let _ = writeln!(stdout, "{reply}");
                    let _ = stdout.flush();
                    return;
                }
                reply
            }
            Err(e) => json!({"id": null, "ok": false,
                             "error": {"type": "DriverError", "message": e.to_string()}}),
        };
        let _ = writeln!(stdout, "{reply}");
        let _ = stdout.flush();
    }
}
