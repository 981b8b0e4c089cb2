//! Agent-like benchmark workloads: each command times one *candidate* (an implementation with a
//! given configuration) of one operator at one problem size, so candidates of a *group* (same
//! operator and size) have a true ranking. Written as JSON Lines, one [`Command`] per line.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::Path;

/// The candidate script of the cpu profile (stdlib Python).
pub const EVAL_CPU_PY: &str = include_str!("../py/eval_cpu.py");
/// The candidate script of the gpu profile (torch + Triton).
pub const EVAL_GPU_PY: &str = include_str!("../py/eval_gpu.py");

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Stdlib-Python kernels on the `cpu` device: runs anywhere (CI).
    Cpu,
    /// Triton kernels of six operators on a GPU.
    Gpu,
}

impl Profile {
    pub fn script(self) -> (&'static str, &'static str) {
        match self {
            Profile::Cpu => ("eval_cpu.py", EVAL_CPU_PY),
            Profile::Gpu => ("eval_gpu.py", EVAL_GPU_PY),
        }
    }
}

/// One benchmark command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Unique within the workload; also the measurement name the command reports.
    pub id: String,
    pub profile: Profile,
    pub operator: String,
    /// Candidates of one group are ranked against each other.
    pub group: String,
    pub candidate: String,
    /// What the script receives (JSON): id, operator, size, params, dtype, seed.
    pub spec: Value,
    /// Estimated duration of the timed kernel in milliseconds (places it in a bucket).
    pub est_ms: f64,
    /// The command line, relative to the workload's directory.
    pub argv: Vec<String>,
}

/// A deterministic generator (SplitMix64).
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6b66_6f72_6765_2121)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Target duration ranges of the four buckets (ms), inside their bounds.
const TARGETS: [(f64, f64); 4] = [(0.02, 0.08), (0.15, 0.8), (1.5, 8.0), (12.0, 45.0)];

/// cpu profile: operator → (variant, ns per unit on one core of the developer machine).
const CPU_OPS: [(&str, &[(&str, f64)]); 3] = [
    ("crc", &[("whole", 0.5), ("chunk64k", 0.52), ("chunk4k", 0.65)]),
    ("hash", &[("sha1", 0.7), ("sha256", 0.87), ("md5", 1.5)]),
    ("sum", &[("builtin", 6.5), ("fsum", 10.0), ("loop", 30.0)]),
];

fn command(
    profile: Profile,
    id: usize,
    operator: &str,
    group: &str,
    candidate: &str,
    spec: Value,
    est_ms: f64,
) -> Command {
    let id = format!("c{id:05}");
    let mut spec = spec;
    spec["id"] = json!(id);
    let (script, _) = profile.script();
    Command {
        argv: vec!["python3".into(), script.into(), spec.to_string()],
        id,
        profile,
        operator: operator.into(),
        group: group.into(),
        candidate: candidate.into(),
        spec,
        est_ms,
    }
}

/// Generate a workload with at least `per_bucket` commands (by estimate) in each duration bucket.
/// `gpu_list` is the output of `eval_gpu.py --list` (candidates and sizes) for the gpu profile.
pub fn generate(profile: Profile, seed: u64, per_bucket: usize, gpu_list: Option<&Value>) -> Result<Vec<Command>> {
    if per_bucket == 0 {
        bail!("--per-bucket must be at least 1");
    }
    let mut rng = Rng::new(seed);
    let mut cmds: Vec<Command> = Vec::new();
    let mut counts = [0usize; 4];
    let mut group_no = 0usize;
    let gpu = match (profile, gpu_list) {
        (Profile::Gpu, Some(v)) => Some(GpuSpace::from_list(v)?),
        (Profile::Gpu, None) => bail!("the gpu profile needs the candidate list of eval_gpu.py"),
        (Profile::Cpu, _) => None,
    };
    for b in 0..4 {
        let mut guard = 0;
        while counts[b] < per_bucket {
            guard += 1;
            if guard > 10_000 {
                bail!("could not fill bucket {} with {per_bucket} commands", crate::report::BUCKETS[b]);
            }
            let (lo, hi) = TARGETS[b];
            let target = lo * (hi / lo).powf(rng.unit());
            let group_seed = rng.next_u64() % 1_000_000;
            group_no += 1;
            let new: Vec<(String, String, Value, f64)> = match &gpu {
                None => {
                    let (op, variants) = CPU_OPS[rng.below(CPU_OPS.len())];
                    // Size the group so its reference (first) variant takes `target`.
                    let n = ((target * 1e6 / variants[0].1).round() as u64).max(64);
                    variants
                        .iter()
                        .map(|(v, ns)| {
                            let spec =
                                json!({"operator": op, "size": {"n": n}, "params": {"variant": v}, "seed": group_seed});
                            (op.to_string(), v.to_string(), spec, n as f64 * ns / 1e6)
                        })
                        .collect()
                }
                Some(space) => space.group_near(target, &mut rng, group_seed),
            };
            let group = format!("g{group_no:04}");
            for (op, cand, spec, est) in new {
                counts[crate::report::bucket_of(est)] += 1;
                let id = cmds.len();
                cmds.push(command(profile, id, &op, &group, &cand, spec, est));
            }
        }
    }
    // Interleave operators and sizes as agents would; ids stay as generated.
    rng.shuffle(&mut cmds);
    Ok(cmds)
}

/// [`generate`], listing the gpu profile's candidate space with `python` when it needs it.
pub fn generate_listing_with(profile: Profile, seed: u64, per_bucket: usize, python: &str) -> Result<Vec<Command>> {
    let list = match profile {
        Profile::Cpu => None,
        Profile::Gpu => Some(gpu_candidate_list(python)?),
    };
    generate(profile, seed, per_bucket, list.as_ref())
}

/// The gpu profile's candidates and sizes: `eval_gpu.py --list` run with `python` (no GPU needed).
pub fn gpu_candidate_list(python: &str) -> Result<Value> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let script = dir.path().join("eval_gpu.py");
    std::fs::write(&script, EVAL_GPU_PY).with_context(|| format!("writing {}", script.display()))?;
    let o = std::process::Command::new(python)
        .arg(&script)
        .arg("--list")
        .output()
        .with_context(|| format!("running {python}"))?;
    if !o.status.success() {
        bail!("{python} eval_gpu.py --list failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    serde_json::from_slice(&o.stdout).context("reading the gpu candidate list")
}

/// Commands per duration bucket (see [`crate::report::BUCKETS`]), by estimate.
pub fn bucket_counts(cmds: &[Command]) -> [usize; 4] {
    let mut counts = [0usize; 4];
    for c in cmds {
        counts[crate::report::bucket_of(c.est_ms)] += 1;
    }
    counts
}

/// The gpu candidate space from `eval_gpu.py --list`.
struct GpuSpace {
    /// operator → candidate params
    candidates: Vec<(String, Value)>,
    /// (operator, size, dtype, est_ms)
    sizes: Vec<(String, Value, String, f64)>,
}

impl GpuSpace {
    fn from_list(v: &Value) -> Result<GpuSpace> {
        let cands = v["candidates"].as_array().context("eval_gpu.py --list: no candidates")?;
        let sizes = v["sizes"].as_array().context("eval_gpu.py --list: no sizes")?;
        let candidates: Vec<(String, Value)> =
            cands.iter().filter_map(|c| Some((c["operator"].as_str()?.to_string(), c["params"].clone()))).collect();
        let sizes: Vec<(String, Value, String, f64)> = sizes
            .iter()
            .filter_map(|s| {
                Some((
                    s["operator"].as_str()?.to_string(),
                    s["size"].clone(),
                    s["dtype"].as_str().unwrap_or("float16").to_string(),
                    s["est_ms"].as_f64()?,
                ))
            })
            .collect();
        if candidates.is_empty() || sizes.is_empty() {
            bail!("eval_gpu.py --list gave no usable candidates or sizes");
        }
        Ok(GpuSpace { candidates, sizes })
    }

    /// All candidates of the size whose estimate is closest to `target` (ties broken at random).
    fn group_near(&self, target: f64, rng: &mut Rng, seed: u64) -> Vec<(String, String, Value, f64)> {
        let best = self
            .sizes
            .iter()
            .map(|s| ((s.3 / target).ln().abs(), s))
            .fold(None::<(f64, Vec<&(String, Value, String, f64)>)>, |acc, (d, s)| match acc {
                Some((bd, mut v)) if (d - bd).abs() < 1e-9 => {
                    v.push(s);
                    Some((bd, v))
                }
                Some((bd, v)) if bd < d => Some((bd, v)),
                _ => Some((d, vec![s])),
            })
            .map(|(_, v)| v)
            .unwrap_or_default();
        let (op, size, dtype, est) = best[rng.below(best.len())];
        self.candidates
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, params)| {
                let name = params
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
                    .unwrap_or_default();
                let spec = json!({"operator": op, "size": size, "params": params, "dtype": dtype, "seed": seed});
                (op.clone(), name, spec, *est)
            })
            .collect()
    }
}

/// Write the workload and its candidate script into the workload's directory.
pub fn write(path: &Path, cmds: &[Command]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = String::new();
    for c in cmds {
        out.push_str(&serde_json::to_string(c)?);
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?;
    if let Some(p) = cmds.first().map(|c| c.profile) {
        let (name, body) = p.script();
        std::fs::write(dir.join(name), body).with_context(|| format!("writing {}", dir.join(name).display()))?;
    }
    Ok(())
}

/// Read a workload; every line must be a command.
pub fn read(path: &Path) -> Result<Vec<Command>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading workload {}", path.display()))?;
    let mut cmds = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let c: Command = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a workload command", path.display(), i + 1))?;
        cmds.push(c);
    }
    if cmds.is_empty() {
        bail!("workload {} has no commands", path.display());
    }
    let mut ids: Vec<&str> = cmds.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        bail!("workload {}: command id {} appears twice", path.display(), w[0]);
    }
    Ok(cmds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::bucket_of;

    #[test]
    fn cpu_workload_is_deterministic_and_fills_buckets() {
        let a = generate(Profile::Cpu, 5, 12, None).unwrap();
        assert_eq!(a, generate(Profile::Cpu, 5, 12, None).unwrap());
        assert_ne!(a, generate(Profile::Cpu, 6, 12, None).unwrap());
        let mut counts = [0; 4];
        for c in &a {
            counts[bucket_of(c.est_ms)] += 1;
            assert_eq!(c.spec["id"], json!(c.id));
            assert_eq!(c.argv[1], "eval_cpu.py");
        }
        assert!(counts.iter().all(|&n| n >= 12), "{counts:?}");
        assert_eq!(bucket_counts(&a), counts);
        assert_eq!(generate_listing_with(Profile::Cpu, 5, 12, "no-python-needed").unwrap(), a);
        // Every group holds all variants of one operator at one size.
        let g = &a[0].group;
        let members: Vec<&Command> = a.iter().filter(|c| &c.group == g).collect();
        assert_eq!(members.len(), 3);
        assert!(members.iter().all(|c| c.operator == members[0].operator && c.spec["size"] == members[0].spec["size"]));
    }

    #[test]
    fn gpu_workload_from_a_list() {
        let list = json!({
            "candidates": [{"operator": "matmul", "params": {"BLOCK_M": 64}}, {"operator": "matmul", "params": {"BLOCK_M": 128}},
                            {"operator": "softmax", "params": {"BLOCK_N": 1024}}],
            "sizes": [{"operator": "matmul", "size": {"m": 512}, "dtype": "float16", "est_ms": 0.05},
                      {"operator": "matmul", "size": {"m": 2048}, "dtype": "float16", "est_ms": 0.5},
                      {"operator": "softmax", "size": {"m": 8192}, "dtype": "float16", "est_ms": 3.0},
                      {"operator": "softmax", "size": {"m": 65536}, "dtype": "float16", "est_ms": 20.0}]
        });
        let w = generate(Profile::Gpu, 1, 4, Some(&list)).unwrap();
        assert_eq!(w, generate(Profile::Gpu, 1, 4, Some(&list)).unwrap());
        assert!(w.iter().any(|c| c.operator == "softmax" && c.est_ms == 20.0));
        assert!(w.iter().all(|c| c.argv[1] == "eval_gpu.py"));
        assert!(generate(Profile::Gpu, 1, 4, None).is_err());
        assert!(generate(Profile::Gpu, 1, 4, Some(&json!({}))).is_err());
    }

    #[test]
    fn round_trip_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.jsonl");
        let w = generate(Profile::Cpu, 1, 2, None).unwrap();
        write(&p, &w).unwrap();
        assert_eq!(read(&p).unwrap(), w);
        assert!(dir.path().join("eval_cpu.py").exists());
        std::fs::write(&p, "{\"nope\": 1}\n").unwrap();
        assert!(read(&p).unwrap_err().to_string().contains("w.jsonl:1"));
        std::fs::write(&p, "").unwrap();
        assert!(read(&p).unwrap_err().to_string().contains("no commands"));
    }
}
