//! `kforge status`: the daemon's devices, mechanisms, jobs and region queues, as a table or JSON.

use anyhow::{bail, Result};
use kforge_client::Client;
use kforge_proto::{DeviceStatus, Reply, Request, StatusReport};
use std::path::Path;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn status(socket: &Path, a: StatusArgs) -> Result<i32> {
    let mut c = Client::connect(socket)?;
    let Reply::Status(s) = c.request(&Request::Status)? else { bail!("unexpected reply to status") };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", table(&s));
    }
    Ok(0)
}

/// The status table: the daemon's settings, one row (and its detail lines) per device, then the jobs.
fn table(s: &StatusReport) -> String {
    let mut t = String::new();
    t += &format!("daemon pid {}  protocol {}  socket {}\n", s.daemon_pid, s.protocol, s.socket);
    t += &format!("store      {}\n", s.db);
    t += &format!("policy     {} (default)\n", s.default_policy.as_str());
    t += &format!("freeze     {} (scope {})\n", s.freeze_mechanism, s.freeze_scope);
    t += &format!("isolation  {}\n", s.isolation);
    t += &format!(
        "gate shim  {}\n",
        s.gate_shim.as_deref().unwrap_or("none (GPU work of other jobs is not held or drained)")
    );
    t += "\n";
    t += &format!(
        "{:<6} {:<5} {:>4} {:>7} {:>6}  {:<24} REGION QUEUE\n",
        "DEVICE", "KIND", "MAX", "RUNNING", "QUEUED", "REGION HOLDER"
    );
    for d in &s.devices {
        t += &device_rows(d);
    }
    if !s.jobs.is_empty() {
        t += "\n";
        t += &format!(
            "{:>6} {:<6} {:<8} {:<8} {:>8} {:<6} {:<28} COMMAND\n",
            "JOB", "DEVICE", "POLICY", "STATE", "PID", "FROZEN", "GPU MEMORY (PEAK/EXPECTED)"
        );
        for j in &s.jobs {
            t += &format!(
                "{:>6} {:<6} {:<8} {:<8} {:>8} {:<6} {:<28} {}\n",
                j.job,
                j.device,
                j.policy.as_str(),
                j.state,
                j.pid.map(|p| p.to_string()).unwrap_or("-".into()),
                if j.frozen { "yes" } else { "no" },
                job_memory(j.memory.as_ref()),
                j.argv.join(" ")
            );
        }
    }
    t
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// A job's memory cell: observed peak / expected peak (its source), `retried` on a second run.
fn job_memory(m: Option<&kforge_proto::JobMemoryStatus>) -> String {
    let Some(m) = m else { return "-".into() };
    let expected = m.expected_bytes.map(gib).unwrap_or("-".into());
    let retried = if m.retried { " retried" } else { "" };
    format!("{} / {} {}{retried}", gib(m.observed_peak_bytes), expected, m.source)
}

/// One device's row, its description, and its GPU groups and warm pool when it has them.
fn device_rows(d: &DeviceStatus) -> String {
    let holder = d
        .region_holder
        .as_ref()
        .map(|r| {
            format!(
                "#{} {} (job {}) {:.0} ms",
                r.region,
                r.name,
                r.job.map(|j| j.to_string()).unwrap_or("-".into()),
                r.since_ms
            )
        })
        .unwrap_or("-".into());
    let queue: Vec<String> = d.region_queue.iter().map(|r| format!("#{}", r.region)).collect();
    let mut t = format!(
        "{:<6} {:<5} {:>4} {:>7} {:>6}  {:<24} {}\n",
        d.name,
        d.kind,
        d.max_concurrent,
        d.running.len(),
        d.queued.len(),
        holder,
        if queue.is_empty() { "-".into() } else { queue.join(" ") }
    );
    t += &format!("       {}\n", d.description);
    if let Some(m) = &d.memory {
        t += &format!(
            "       memory: {} free of {}, {} reserved by admission, {} used by managed processes\n",
            gib(m.free_bytes),
            gib(m.total_bytes),
            gib(m.reserved_bytes),
            gib(m.managed_bytes)
        );
    }
    if d.gpu_groups > 0 {
        t += &format!("       GPU groups bound here: {}\n", d.gpu_groups);
    }
    if !d.stragglers.is_empty() {
        let who: Vec<String> = d
            .stragglers
            .iter()
            .map(|s| {
                format!("pid {} (since region {}'s drain, {} drain(s) skipped it)", s.pid, s.since_region, s.skipped)
            })
            .collect();
        t += &format!("       not waited for by drains (still behind, regions tainted): {}\n", who.join(", "));
    }
    let p = &d.pool;
    if p.size > 0 || !p.recycled.is_empty() {
        let recycled: Vec<String> = p.recycled.iter().map(|(k, v)| format!("{v}× {k}")).collect();
        t += &format!(
            "       warm pool: size {}, warm {}, busy {}, starting {}, jobs served {}, recycled {}{}\n",
            p.size,
            p.warm,
            p.busy,
            p.starting,
            p.jobs_served,
            if recycled.is_empty() { "0".into() } else { recycled.join(", ") },
            p.disabled.as_ref().map(|d| format!(" — DISABLED: {d}")).unwrap_or_default()
        );
    }
    t
}
