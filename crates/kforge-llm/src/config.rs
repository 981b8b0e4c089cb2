//! Which provider to talk to and how: a [`ProviderConfig`] resolved from flags, the
//! environment and a TOML file, in that order of precedence.
//!
//! The file (`KFORGE_LLM_CONFIG` names it):
//!
//! ```toml
//! default = "local"                   # the endpoint used when neither --llm nor KFORGE_LLM_URL says
//!
//! [endpoints.local]
//! url = "http://127.0.0.1:8000/v1"   # requests go to {url}/chat/completions
//! model = "qwen2.5-coder"             # optional: the model when neither --model nor KFORGE_LLM_MODEL says
//! key_env = "VLLM_KEY"                # optional: the variable holding the key
//! timeout_s = 300                     # optional (120)
//! max_attempts = 5                    # optional (5)
//! stream = true                       # optional (true)
//!
//! [models."gpt-5"]
//! input_usd_per_mtok = 1.25
//! output_usd_per_mtok = 10.0
//! reasoning = true                    # max_completion_tokens, no temperature
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::chat::Usage;
use crate::LlmError;

/// A model's prices in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize)]
pub struct Price {
    /// Per million prompt tokens.
    pub input_usd_per_mtok: f64,
    /// Per million completion tokens (reasoning tokens included).
    pub output_usd_per_mtok: f64,
}

impl Price {
    /// What `usage` costs at these prices.
    pub fn cost(&self, usage: &Usage) -> f64 {
        usage.prompt_tokens as f64 * self.input_usd_per_mtok / 1e6
            + usage.completion_tokens as f64 * self.output_usd_per_mtok / 1e6
    }
}

/// One OpenAI-compatible endpoint and model, and how to talk to it.
#[derive(Clone, PartialEq)]
pub struct ProviderConfig {
    /// The API's base, e.g. `http://127.0.0.1:8000/v1` (no trailing `/`); requests go to
    /// `{url}/chat/completions`.
    pub url: String,
    /// The `model` of every request.
    pub model: String,
    /// Sent as `Authorization: Bearer …` when set.
    pub api_key: Option<String>,
    /// The model's prices; `None`: calls cost 0 USD (token budgets still count).
    pub price: Option<Price>,
    /// A reasoning model: `max_completion_tokens` instead of `max_tokens`, no temperature.
    pub reasoning: bool,
    /// The whole exchange of one attempt (connect, send, the full reply), in seconds.
    pub timeout_s: f64,
    /// HTTP attempts per call, retries included.
    pub max_attempts: u32,
    /// The first retry's wait; each further one doubles it.
    pub backoff_base_s: f64,
    /// No wait (a server's `Retry-After` included) is longer.
    pub backoff_cap_s: f64,
    /// Ask for a server-sent-event stream (progress as the reply arrives).
    pub stream: bool,
}

impl std::fmt::Debug for ProviderConfig {
    /// The key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("price", &self.price)
            .field("reasoning", &self.reasoning)
            .field("timeout_s", &self.timeout_s)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_base_s", &self.backoff_base_s)
            .field("backoff_cap_s", &self.backoff_cap_s)
            .field("stream", &self.stream)
            .finish()
    }
}

impl ProviderConfig {
    /// A configuration with the defaults (no key, unpriced, not reasoning, 120 s, 5 attempts,
    /// backoff 1 s doubling up to 30 s, streaming). `url` is checked and normalized.
    pub fn new(url: &str, model: &str) -> Result<ProviderConfig, LlmError> {
        if model.trim().is_empty() {
            return Err(LlmError::Config("the model name is empty".into()));
        }
        Ok(ProviderConfig {
            url: normalize_url(url)?,
            model: model.to_string(),
            api_key: None,
            price: None,
            reasoning: false,
            timeout_s: 120.0,
            max_attempts: 5,
            backoff_base_s: 1.0,
            backoff_cap_s: 30.0,
            stream: true,
        })
    }

    /// The URL requests are posted to.
    pub fn completions_url(&self) -> String {
        format!("{}/chat/completions", self.url)
    }

    /// Resolves the provider: `url_or_name` (`--llm`: a URL, or an endpoint of the file) and
    /// `model` (`--model`) override the environment (`KFORGE_LLM_URL`, `KFORGE_LLM_MODEL`),
    /// which overrides the file (`file`, else `KFORGE_LLM_CONFIG`). The key comes from
    /// `KFORGE_LLM_KEY`, else from the variable the endpoint's `key_env` names, else (only
    /// when the endpoint names none and it is `https://api.openai.com/…`) from `OPENAI_API_KEY`.
    /// `env` reads a variable.
    pub fn resolve(
        url_or_name: Option<&str>,
        model: Option<&str>,
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ProviderConfig, LlmError> {
        let env_file = env("KFORGE_LLM_CONFIG").filter(|p| !p.is_empty());
        let file_path = file.map(Path::to_path_buf).or(env_file.map(Into::into));
        let file = match &file_path {
            Some(path) => Some(ConfigFile::read(path)?),
            None => None,
        };
        let chosen = url_or_name.map(str::to_string).or_else(|| env("KFORGE_LLM_URL").filter(|s| !s.is_empty()));
        let (url, endpoint) = pick_endpoint(chosen.as_deref(), file.as_ref(), file_path.as_deref())?;
        let model = model
            .map(str::to_string)
            .or_else(|| env("KFORGE_LLM_MODEL").filter(|s| !s.is_empty()))
            .or_else(|| endpoint.and_then(|e| e.model.clone()))
            .ok_or_else(|| {
                LlmError::Config(
                    "no model: pass --model NAME, set KFORGE_LLM_MODEL, or give the endpoint a model".into(),
                )
            })?;
        let mut config = ProviderConfig::new(&url, &model)?;
        config.api_key = api_key(endpoint, &config.url, env)?;
        if let Some(e) = endpoint {
            config.apply(e)?;
        }
        if let Some(m) = file.as_ref().and_then(|f| f.models.get(&config.model)) {
            for v in [m.input_usd_per_mtok, m.output_usd_per_mtok].into_iter().flatten() {
                if !(v >= 0.0 && v.is_finite()) {
                    return Err(LlmError::Config(format!(
                        "model {:?}: a price must be a number of dollars, 0 or more, got {v}",
                        config.model
                    )));
                }
            }
            config.price = m.price();
            config.reasoning = m.reasoning;
        }
        Ok(config)
    }

    fn apply(&mut self, endpoint: &Endpoint) -> Result<(), LlmError> {
        if let Some(t) = endpoint.timeout_s {
            if !(t > 0.0 && t.is_finite()) {
                return Err(LlmError::Config(format!("timeout_s must be a positive number of seconds, not {t}")));
            }
            self.timeout_s = t;
        }
        if let Some(n) = endpoint.max_attempts {
            if n == 0 {
                return Err(LlmError::Config("max_attempts must be at least 1".into()));
            }
            self.max_attempts = n;
        }
        if let Some(s) = endpoint.stream {
            self.stream = s;
        }
        Ok(())
    }
}

/// Checks the scheme and drops a trailing `/` (and a pasted `/chat/completions`).
fn normalize_url(url: &str) -> Result<String, LlmError> {
    let url = url.trim();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(LlmError::Config(format!("{url:?} is not an http:// or https:// URL")));
    }
    let url = url.trim_end_matches('/');
    let url = url.strip_suffix("/chat/completions").unwrap_or(url);
    if url.split_once("://").is_none_or(|(_, rest)| rest.is_empty() || rest.starts_with('/')) {
        return Err(LlmError::Config(format!("{url:?} names no host")));
    }
    Ok(url.to_string())
}

fn is_url(s: &str) -> bool {
    s.contains("://")
}

/// The URL and, when the choice names one of the file's endpoints (or the file's default is
/// used), that endpoint.
fn pick_endpoint<'f>(
    chosen: Option<&str>,
    file: Option<&'f ConfigFile>,
    path: Option<&Path>,
) -> Result<(String, Option<&'f Endpoint>), LlmError> {
    let name = match chosen {
        Some(c) if is_url(c) => return Ok((c.to_string(), None)),
        Some(name) => name.to_string(),
        None => match file.and_then(ConfigFile::default_endpoint) {
            Some(name) => name,
            None => {
                return Err(LlmError::Config(
                    "no URL: pass --llm URL (or an endpoint's name), set KFORGE_LLM_URL, or set `default` in the \
                     config file"
                        .into(),
                ))
            }
        },
    };
    let Some(file) = file else {
        return Err(LlmError::Config(format!(
            "{name:?} is neither a URL (http://…) nor an endpoint: no config file (set KFORGE_LLM_CONFIG)"
        )));
    };
    match file.endpoints.get(&name) {
        Some(e) => Ok((e.url.clone(), Some(e))),
        None => {
            let known: Vec<&str> = file.endpoints.keys().map(String::as_str).collect();
            Err(LlmError::Config(format!(
                "no endpoint {name:?} in {} (known: {})",
                path.map(|p| p.display().to_string()).unwrap_or_default(),
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )))
        }
    }
}

/// OpenAI's own key goes to OpenAI only, never to whatever host `--llm` names.
fn api_key(
    endpoint: Option<&Endpoint>,
    url: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, LlmError> {
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    if let Some(key) = set("KFORGE_LLM_KEY") {
        return Ok(Some(key));
    }
    match endpoint.and_then(|e| e.key_env.as_deref()) {
        Some(var) => set(var).map(Some).ok_or_else(|| {
            LlmError::Config(format!("the endpoint's key_env names {var}, which is not set (or set KFORGE_LLM_KEY)"))
        }),
        None if url.starts_with("https://api.openai.com/") => Ok(set("OPENAI_API_KEY")),
        None => Ok(None),
    }
}

/// The TOML file's contents.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    default: Option<String>,
    #[serde(default)]
    endpoints: BTreeMap<String, Endpoint>,
    #[serde(default)]
    models: BTreeMap<String, ModelEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Endpoint {
    url: String,
    model: Option<String>,
    key_env: Option<String>,
    timeout_s: Option<f64>,
    max_attempts: Option<u32>,
    stream: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    input_usd_per_mtok: Option<f64>,
    output_usd_per_mtok: Option<f64>,
    #[serde(default)]
    reasoning: bool,
}

impl ModelEntry {
    fn price(&self) -> Option<Price> {
        match (self.input_usd_per_mtok, self.output_usd_per_mtok) {
            (None, None) => None,
            (i, o) => Some(Price { input_usd_per_mtok: i.unwrap_or(0.0), output_usd_per_mtok: o.unwrap_or(0.0) }),
        }
    }
}

impl ConfigFile {
    fn read(path: &Path) -> Result<ConfigFile, LlmError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| LlmError::Config(format!("reading {}: {e}", path.display())))?;
        let file: ConfigFile = toml::from_str(&text).map_err(|e| {
            let line = e.span().map(|s| text.get(..s.start).unwrap_or(&text).matches('\n').count() + 1);
            let at = line.map(|l| format!(" line {l}:")).unwrap_or_default();
            LlmError::Config(format!("{}:{at} {}", path.display(), e.message()))
        })?;
        for (name, e) in &file.endpoints {
            normalize_url(&e.url).map_err(|err| {
                LlmError::Config(format!("{}: endpoint {name:?}: {}", path.display(), config_problem(err)))
            })?;
        }
        if let Some(d) = &file.default {
            if !file.endpoints.contains_key(d) {
                return Err(LlmError::Config(format!("{}: default {d:?} is not an endpoint", path.display())));
            }
        }
        Ok(file)
    }

    /// `default`, else the only endpoint.
    fn default_endpoint(&self) -> Option<String> {
        self.default.clone().or_else(|| match self.endpoints.len() {
            1 => self.endpoints.keys().next().cloned(),
            _ => None,
        })
    }
}

fn config_problem(e: LlmError) -> String {
    match e {
        LlmError::Config(p) => p,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    const FILE: &str = r#"
default = "local"

[endpoints.local]
url = "http://127.0.0.1:8000/v1/"
model = "qwen"
timeout_s = 300
stream = false

[endpoints.router]
url = "https://openrouter.ai/api/v1"
key_env = "ROUTER_KEY"
max_attempts = 3

[models."gpt-5"]
input_usd_per_mtok = 1.25
output_usd_per_mtok = 10.0
reasoning = true
"#;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn message(e: LlmError) -> String {
        e.to_string()
    }

    #[test]
    fn flags_override_environment_override_file() {
        let f = write(FILE);
        let env = env_of(&[("KFORGE_LLM_URL", "http://env:1/v1"), ("KFORGE_LLM_MODEL", "envmodel")]);
        let c = ProviderConfig::resolve(Some("http://flag:2/v1"), Some("flagmodel"), Some(f.path()), &env).unwrap();
        assert_eq!((c.url.as_str(), c.model.as_str()), ("http://flag:2/v1", "flagmodel"));
        let c = ProviderConfig::resolve(None, None, Some(f.path()), &env).unwrap();
        assert_eq!((c.url.as_str(), c.model.as_str()), ("http://env:1/v1", "envmodel"));
        let by_name = env_of(&[("KFORGE_LLM_URL", "router"), ("ROUTER_KEY", "k")]);
        let c = ProviderConfig::resolve(None, Some("m"), Some(f.path()), &by_name).unwrap();
        assert_eq!(c.url, "https://openrouter.ai/api/v1", "KFORGE_LLM_URL may name an endpoint");
        let c = ProviderConfig::resolve(None, None, Some(f.path()), &env_of(&[])).unwrap();
        assert_eq!((c.url.as_str(), c.model.as_str()), ("http://127.0.0.1:8000/v1", "qwen"));
        assert_eq!((c.timeout_s, c.stream, c.max_attempts), (300.0, false, 5));
    }

    #[test]
    fn named_endpoint_takes_its_key_and_model_its_price() {
        let f = write(FILE);
        let env = env_of(&[("ROUTER_KEY", "sk-r"), ("OPENAI_API_KEY", "sk-o")]);
        let c = ProviderConfig::resolve(Some("router"), Some("gpt-5"), Some(f.path()), &env).unwrap();
        assert_eq!(c.api_key.as_deref(), Some("sk-r"));
        assert_eq!(c.max_attempts, 3);
        assert!(c.reasoning);
        assert_eq!(c.price, Some(Price { input_usd_per_mtok: 1.25, output_usd_per_mtok: 10.0 }));
        assert!(!format!("{c:?}").contains("sk-r"), "Debug must not print the key");
        let env = env_of(&[("KFORGE_LLM_KEY", "sk-k"), ("ROUTER_KEY", "sk-r")]);
        let c = ProviderConfig::resolve(Some("router"), Some("m"), Some(f.path()), &env).unwrap();
        assert_eq!(c.api_key.as_deref(), Some("sk-k"));
        let e = ProviderConfig::resolve(Some("router"), Some("m"), Some(f.path()), &env_of(&[])).unwrap_err();
        assert!(message(e).contains("ROUTER_KEY"));
    }

    #[test]
    fn file_path_from_environment_and_openai_key_fallback() {
        let f = write(FILE);
        let path = f.path().to_str().unwrap().to_string();
        let env = env_of(&[("KFORGE_LLM_CONFIG", &path), ("OPENAI_API_KEY", "sk-o")]);
        let c = ProviderConfig::resolve(Some("local"), None, None, &env).unwrap();
        assert_eq!(c.model, "qwen");
        assert_eq!(c.api_key, None, "OpenAI's key is not sent to another host");
        assert_eq!(c.price, None);
        let openai = ProviderConfig::resolve(Some("https://api.openai.com/v1"), Some("gpt-4.1"), None, &env).unwrap();
        assert_eq!(openai.api_key.as_deref(), Some("sk-o"));
    }

    #[test]
    fn clear_errors() {
        let f = write(FILE);
        let none = env_of(&[]);
        let e = message(ProviderConfig::resolve(Some("nope"), Some("m"), Some(f.path()), &none).unwrap_err());
        assert!(e.contains("\"nope\"") && e.contains("local, router"), "{e}");
        let e = message(ProviderConfig::resolve(None, Some("m"), None, &none).unwrap_err());
        assert!(e.contains("no URL"), "{e}");
        let e = message(ProviderConfig::resolve(Some("http://h/v1"), None, None, &none).unwrap_err());
        assert!(e.contains("no model"), "{e}");
        let e = message(ProviderConfig::resolve(Some("ftp://h/v1"), Some("m"), None, &none).unwrap_err());
        assert!(e.contains("not an http"), "{e}");
        let e = message(ProviderConfig::resolve(Some("local"), Some("m"), None, &none).unwrap_err());
        assert!(e.contains("no config file"), "{e}");
        let missing = Path::new("/nonexistent/kforge-llm.toml");
        let e = message(ProviderConfig::resolve(None, Some("m"), Some(missing), &none).unwrap_err());
        assert!(e.contains("/nonexistent/kforge-llm.toml"), "{e}");
        let bad = write("[endpoints.a]\nurl = \"http://x\"\n\ntimeout_s = = 3\n");
        let e = message(ProviderConfig::resolve(None, Some("m"), Some(bad.path()), &none).unwrap_err());
        assert!(e.contains(&bad.path().display().to_string()) && e.contains("line 4"), "{e}");
        let typo = write("[endpoints.a]\nurl = \"http://x\"\ntimeout = 3\n");
        let e = message(ProviderConfig::resolve(None, Some("m"), Some(typo.path()), &none).unwrap_err());
        assert!(e.contains("line 3") && e.contains("timeout"), "{e}");
        let default = write("default = \"b\"\n[endpoints.a]\nurl = \"http://x\"\n");
        let e = message(ProviderConfig::resolve(None, Some("m"), Some(default.path()), &none).unwrap_err());
        assert!(e.contains("default \"b\" is not an endpoint"), "{e}");
        let scheme = write("[endpoints.a]\nurl = \"localhost:8000\"\n");
        let e = message(ProviderConfig::resolve(None, Some("m"), Some(scheme.path()), &none).unwrap_err());
        assert!(e.contains("endpoint \"a\"") && e.contains("not an http"), "{e}");
    }

    #[test]
    fn url_is_normalized() {
        let c = ProviderConfig::new("http://h:1/v1/chat/completions", "m").unwrap();
        assert_eq!(c.completions_url(), "http://h:1/v1/chat/completions");
        assert!(ProviderConfig::new("http://", "m").is_err());
    }

    #[test]
    fn price_of_usage() {
        let p = Price { input_usd_per_mtok: 2.0, output_usd_per_mtok: 8.0 };
        let u = Usage { prompt_tokens: 1_000_000, completion_tokens: 500_000, estimated: false };
        assert!((p.cost(&u) - 6.0).abs() < 1e-9);
    }
}
