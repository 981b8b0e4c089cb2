//! Start-up, the socket, the connection threads and the event loop (which hands events to the
//! state machine and its effects to the [`Executor`]).

use crate::config::Config;
use crate::device_thread::{self, DeviceThreadConfig};
use crate::effect::RegionStep;
use crate::event::{ConnId, Event, Inbound, Now, Outgoing};
use crate::executor::Executor;
use crate::guardian::{recover_stale, Ledger};
use crate::state::{Daemon, DaemonParts, DeviceSetup};
use crate::store::StoreHandle;
use crate::{devices, memory, DaemonError};
use kforge_freeze::Freezer;
use kforge_gate::Gate;
use kforge_proto::{ErrorCode, ProtoError, Request};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Slots per gate segment: the most GPU processes one device can have registered.
pub const GATE_SLOTS: u32 = 256;

/// A running daemon (in this process).
pub struct DaemonHandle {
    pub socket: PathBuf,
    pub freeze_mechanism: String,
    events: Sender<Inbound>,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
}

impl DaemonHandle {
    /// Ask the daemon to stop (as SIGTERM does).
    pub fn shutdown(&self) {
        let _ = self.events.send(Event::Shutdown.into());
    }
    pub fn shutdown_sender(&self) -> Sender<Inbound> {
        self.events.clone()
    }
    /// Wait until the daemon has stopped.
    pub fn wait(mut self) -> Result<(), DaemonError> {
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(DaemonError::Config("the daemon's event loop panicked".into())),
            None => Ok(()),
        }
    }
}

/// Run a daemon until it is shut down.
pub fn run(cfg: Config, guardian: Option<Vec<OsString>>) -> Result<(), DaemonError> {
    start(cfg, guardian)?.wait()
}

fn mkdir_private(p: &Path) -> Result<(), DaemonError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(|e| DaemonError::io("creating directory", p, e))
}

/// Bind the socket and start all threads. `guardian` is the command line of the guardian
/// process (`kforge __guardian`); None runs without one (tests that kill nothing).
pub fn start(cfg: Config, guardian: Option<Vec<OsString>>) -> Result<DaemonHandle, DaemonError> {
    let pid = std::process::id();
    let state_dir = claim_socket_and_recover(&cfg)?;
    let ledger_path = state_dir.join("ledger.json");

    let freezer_name = format!("kforge-{pid}");
    let freezer = Arc::new(Freezer::detect(&freezer_name, cfg.freeze_mechanism)?);
    let cores = split_cores(cfg.reserve_cores, cfg.region_cpus.as_deref())?;
    let devs = devices::discover(&cfg.gpus)?;

    let store = open_store(&cfg.db)?;
    let first_ids = store.max_ids()?;
    let learned_peaks = store.learned_peaks(crate::state::LEARNED_CAPACITY)?;
    let learned_lengths = store.learned_lengths(crate::state::LEARNED_CAPACITY)?;

    let python_dir = state_dir.join("python");
    kforge_python::write_package(&python_dir)?;
    kforge_python::write_auto_regions(&python_dir)?;

    let (events_tx, events_rx) = channel::<Inbound>();
    // Per device: a region is held there (its device thread sets it; the memory sampler reads it).
    let in_region: Vec<Arc<AtomicBool>> = devs.iter().map(|_| Arc::new(AtomicBool::new(false))).collect();
    let sampled: Vec<memory::SampledDevice> = devs
        .iter()
        .enumerate()
        .map(|(index, d)| memory::SampledDevice {
            index,
            name: d.name.clone(),
            nvml_index: nvml_index(d),
            in_region: in_region[index].clone(),
        })
        .collect();
    let devices = start_devices(&cfg, pid, devs, &freezer, &events_tx, &in_region)?;
    let ledger = Ledger::new(ledger_path, pid, &freezer, &freezer_name, devices.gate_paths);
    ledger.write(&[])?;

    let listener = bind_owner_only(&cfg.socket)?;

    let guardian_child = match guardian {
        Some(argv) => Some(spawn_guardian(&argv, ledger.path())?),
        None => None,
    };

    let daemon = Daemon::new(
        DaemonParts {
            cfg: cfg.clone(),
            freeze_mechanism: freezer.describe(),
            python_dir,
            base_env: std::env::vars().collect(),
            daemon_pid: pid,
            devices: devices.setups,
            reserved_cores: cores.reserved,
            idle_siblings: cores.idle_siblings,
            shared_siblings: cores.shared_siblings,
            job_cores: cores.jobs,
            first_ids,
            learned_peaks,
            learned_lengths,
        },
        Now::current(),
    );
    let executor = Executor::new(devices.steps, StoreHandle::spawn(store), ledger, freezer.clone(), events_tx.clone());
    let source = match &cfg.debug_gpu_memory {
        Some(f) => memory::MemorySource::File(f.clone()),
        None => memory::MemorySource::Nvml,
    };
    memory::spawn_sampler(source, sampled, events_tx.clone());
    let stop_accept = spawn_accept_thread(listener, events_tx.clone(), &cfg.socket)?;
    let socket = cfg.socket.clone();
    let describe = freezer.describe();
    let thread = std::thread::Builder::new()
        .name("kforge-daemon".into())
        .spawn(move || {
            let r = event_loop(daemon, executor, events_rx);
            clean_up_after_event_loop(&cfg.socket, &stop_accept, &freezer, guardian_child);
            r
        })
        .map_err(|e| DaemonError::io("spawning daemon thread", &socket, e))?;
    Ok(DaemonHandle { socket, freeze_mechanism: describe, events: events_tx, thread: Some(thread) })
}

/// Make the socket's and the state's directories, refuse if a daemon answers on the socket,
/// recover what a dead daemon left behind (its ledger) and remove its stale socket. Returns the
/// state directory.
fn claim_socket_and_recover(cfg: &Config) -> Result<PathBuf, DaemonError> {
    let sock_dir = cfg.socket.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    mkdir_private(&sock_dir)?;
    if UnixStream::connect(&cfg.socket).is_ok() {
        return Err(DaemonError::AlreadyRunning(cfg.socket.display().to_string()));
    }
    let state_dir = cfg.state_dir();
    mkdir_private(&state_dir)?;
    if let Some(r) = recover_stale(&state_dir.join("ledger.json"), false)? {
        eprintln!(
            "kforge daemon: recovered after a dead daemon: killed {} process groups, removed {} cgroups",
            r.process_groups_killed, r.cgroups_removed
        );
    }
    let _ = std::fs::remove_file(&cfg.socket);
    Ok(state_dir)
}

/// The online CPUs split by physical core: one cpu of each reserved core for measuring threads,
/// its SMT siblings idle (shared with jobs on a machine of too few cores), the rest for jobs
/// (`kforge_cores::split_whole_cores`, topology from /sys).
fn split_cores(reserve_cores: usize, chosen: Option<&[u32]>) -> Result<kforge_cores::CoreSplit, DaemonError> {
    let cpus = kforge_cores::online_cpus().map_err(|e| DaemonError::Config(e.to_string()))?;
    let siblings = |c| kforge_cores::smt_siblings(Path::new("/sys"), c);
    match chosen {
        Some(chosen) => kforge_cores::split_chosen_cores(&cpus, chosen, siblings)
            .map_err(|e| DaemonError::Config(format!("--region-cpus: {e}"))),
        None => kforge_cores::split_whole_cores(&cpus, reserve_cores, siblings)
            .map_err(|e| DaemonError::Config(format!("--reserve-cores: {e}"))),
    }
}

/// The store at `db` (`:memory:`: an in-memory one), its directory created if missing.
fn open_store(db: &Path) -> Result<kforge_store::Store, DaemonError> {
    if db.as_os_str() == ":memory:" {
        return Ok(kforge_store::Store::open_in_memory()?);
    }
    if let Some(parent) = db.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| DaemonError::io("creating store directory", parent, e))?;
    }
    Ok(kforge_store::Store::open(db)?)
}

/// What starting the devices made: the gate segments (for the ledger), the devices as the state
/// machine sees them, and the channel to each device's thread.
struct StartedDevices {
    gate_paths: Vec<PathBuf>,
    setups: Vec<DeviceSetup>,
    steps: Vec<Sender<RegionStep>>,
}

/// Create each device's gate segment and start its device thread.
fn start_devices(
    cfg: &Config,
    pid: u32,
    devs: Vec<devices::DeviceInfo>,
    freezer: &Arc<Freezer>,
    events_tx: &Sender<Inbound>,
    in_region: &[Arc<AtomicBool>],
) -> Result<StartedDevices, DaemonError> {
    let mut started = StartedDevices { gate_paths: Vec::new(), setups: Vec::new(), steps: Vec::new() };
    for (d, in_region) in devs.into_iter().zip(in_region) {
        let gate_path = PathBuf::from(format!("/dev/shm/kforge-{pid}-gate-{}", d.name));
        let _ = std::fs::remove_file(&gate_path);
        let gate = Arc::new(Gate::create(&gate_path, GATE_SLOTS)?);
        started.gate_paths.push(gate_path.clone());
        let steps = device_thread::spawn(
            d.name.clone(),
            DeviceThreadConfig {
                gate: Some(gate),
                freezer: freezer.clone(),
                drain_timeout: cfg.drain_timeout,
                drain: cfg.drain,
                freeze_timeout: cfg.freeze_timeout,
                settle_timeout: cfg.settle_timeout,
                settle_power_fraction: cfg.settle_power_fraction,
                nvml_index: nvml_index(&d),
                in_region: in_region.clone(),
            },
            events_tx.clone(),
        );
        started.steps.push(steps);
        started.setups.push(DeviceSetup { info: d, gate_path: Some(gate_path) });
    }
    Ok(started)
}

/// The NVML index of a GPU device.
fn nvml_index(d: &devices::DeviceInfo) -> Option<u32> {
    match d.kind {
        devices::DeviceKind::Gpu => d.name.parse().ok(),
        devices::DeviceKind::Cpu => None,
    }
}

/// Bind the listening socket, readable and writable by its owner only.
fn bind_owner_only(socket: &Path) -> Result<UnixListener, DaemonError> {
    // Bind owner-only: no moment exists where the socket is reachable with wider permissions.
    // SAFETY: umask only changes this process's file creation mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(socket);
    unsafe { libc::umask(old) };
    let listener = bound.map_err(|e| DaemonError::io("binding socket", socket, e))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| DaemonError::io("chmod socket", socket, e))?;
    Ok(listener)
}

/// Start the thread that accepts connections; returns the flag that stops it.
fn spawn_accept_thread(
    listener: UnixListener,
    events: Sender<Inbound>,
    socket: &Path,
) -> Result<Arc<AtomicBool>, DaemonError> {
    let stop_accept = Arc::new(AtomicBool::new(false));
    let stop = stop_accept.clone();
    std::thread::Builder::new()
        .name("kforge-accept".into())
        .spawn(move || accept_loop(listener, events, stop))
        .map_err(|e| DaemonError::io("spawning accept thread", socket, e))?;
    Ok(stop_accept)
}

/// After the event loop: stop accepting (a connection wakes the accept thread), remove the
/// socket, undo any freezing, and close the guardian's pipe (it then recovers what is left and
/// exits) and wait for it.
fn clean_up_after_event_loop(socket: &Path, stop_accept: &AtomicBool, freezer: &Freezer, guardian: Option<Child>) {
    stop_accept.store(true, Ordering::SeqCst);
    let _ = UnixStream::connect(socket);
    let _ = std::fs::remove_file(socket);
    if let Err(e) = freezer.recover() {
        eprintln!("kforge daemon: final cleanup: {e}");
    }
    if let Some(mut g) = guardian {
        drop(g.stdin.take());
        let _ = g.wait();
    }
}

fn spawn_guardian(argv: &[OsString], ledger: &Path) -> Result<Child, DaemonError> {
    let (prog, args) = argv.split_first().ok_or_else(|| DaemonError::Config("empty guardian command".into()))?;
    let mut cmd = Command::new(prog);
    cmd.args(args).arg("--ledger").arg(ledger).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::inherit());
    // Its own session: a terminal's Ctrl-C to the daemon must not take the guardian with it.
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            crate::jobs::unblock_signals();
            crate::jobs::close_inherited(3);
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| DaemonError::io("starting guardian", prog, e))
}

fn event_loop(mut d: Daemon, mut x: Executor, rx: Receiver<Inbound>) -> Result<(), DaemonError> {
    let effects = d.start(Now::current());
    x.run(&mut d, effects);
    let mut stop_deadline: Option<Instant> = None;
    loop {
        if d.stopping() {
            let dl = *stop_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(5));
            if d.quiescent() || Instant::now() >= dl {
                break;
            }
        }
        let timeout = match (d.next_deadline(), stop_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let inbound = match timeout {
            Some(t) => match rx.recv_timeout(t.saturating_duration_since(Instant::now())) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => Event::Tick.into(),
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(ev) => ev,
                Err(_) => break,
            },
        };
        x.deliver(&mut d, inbound);
        // Leases may also run out while events keep arriving.
        if d.next_deadline().is_some_and(|t| t <= Instant::now()) {
            x.deliver(&mut d, Event::Tick.into());
        }
    }
    x.finish();
    Ok(())
}

fn accept_loop(listener: UnixListener, events: Sender<Inbound>, stop: Arc<AtomicBool>) {
    let mut next: ConnId = 1;
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let conn = next;
        next += 1;
        let (Ok(reader), Ok(writer), Ok(ctl)) = (stream.try_clone(), stream.try_clone(), stream.try_clone()) else {
            continue;
        };
        let (tx, out_rx) = channel::<Outgoing>();
        if events.send(Inbound::Connected { conn, tx, stream: ctl }).is_err() {
            break;
        }
        let _ = std::thread::Builder::new().name(format!("kforge-w{conn}")).spawn(move || writer_loop(writer, out_rx));
        let ev = events.clone();
        let _ =
            std::thread::Builder::new().name(format!("kforge-r{conn}")).spawn(move || reader_loop(conn, reader, ev));
    }
}

fn reader_loop(conn: ConnId, mut s: UnixStream, events: Sender<Inbound>) {
    loop {
        match kforge_proto::read_msg::<Request, _>(&mut s) {
            Ok(req) => {
                if events.send(Event::Request { conn, req }.into()).is_err() {
                    return;
                }
            }
            Err(ProtoError::Closed) | Err(ProtoError::Io(_)) => break,
            Err(e @ ProtoError::Oversized(_)) => {
                let _ =
                    events.send(Event::BadFrame { conn, code: ErrorCode::Oversized, message: e.to_string() }.into());
                break;
            }
            Err(e @ ProtoError::Malformed(_)) => {
                let _ =
                    events.send(Event::BadFrame { conn, code: ErrorCode::Malformed, message: e.to_string() }.into());
                break;
            }
        }
    }
    let _ = events.send(Event::Hangup { conn }.into());
}

fn writer_loop(mut s: UnixStream, rx: Receiver<Outgoing>) {
    for out in rx {
        match out {
            Outgoing::Msg(m) => {
                let frame = match kforge_proto::encode(&m) {
                    Ok(f) => f,
                    Err(e) => match kforge_proto::encode(&kforge_proto::Reply::Error {
                        code: ErrorCode::Internal,
                        message: e.to_string(),
                    }) {
                        Ok(f) => f,
                        Err(_) => continue,
                    },
                };
                if s.write_all(&frame).is_err() {
                    break;
                }
            }
            Outgoing::Close => break,
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Both);
}
