//! `--redecide GLOB,...`: problems of a campaign decided again although a decision for them
//! exists (made before the agents learned something new, or to measure again). A pattern matches
//! a problem's path, or any tail of it that starts after a `/` (`level3/002*` matches
//! `problems/level3/002_multihead_attention_bf16.py`); `*` is any run of characters, `?` one.

use crate::OptimizeError;

/// The `--redecide` patterns, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Redecide {
    patterns: Vec<String>,
}

impl Redecide {
    /// The patterns as given; an empty one is refused.
    pub fn new(patterns: &[String]) -> Result<Redecide, OptimizeError> {
        if patterns.iter().any(|p| p.trim().is_empty()) {
            return Err(OptimizeError::Redecide("an empty pattern".into()));
        }
        Ok(Redecide { patterns: patterns.iter().map(|p| p.trim().to_string()).collect() })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `problem` (a path) is one to decide again.
    pub fn matches(&self, problem: &str) -> bool {
        self.patterns.iter().any(|p| hits(p, problem))
    }

    /// The first pattern none of `problems` matches (a typo would otherwise redecide nothing
    /// silently).
    pub fn unmatched<'a>(&'a self, problems: &[String]) -> Option<&'a str> {
        self.patterns.iter().find(|p| !problems.iter().any(|q| hits(p, q))).map(String::as_str)
    }
}

/// Whether `pattern` matches `path` or one of its tails.
fn hits(pattern: &str, path: &str) -> bool {
    tails(path).any(|t| glob(pattern.as_bytes(), t.as_bytes()))
}

/// `path` and each of its tails after a `/`.
fn tails(path: &str) -> impl Iterator<Item = &str> {
    std::iter::once(path).chain(path.match_indices('/').map(move |(i, _)| &path[i + 1..]))
}

/// Whether `text` matches `pattern` whole (`*`: any run, `?`: one byte).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None; // (pattern index after the *, text index it matched to)
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(p: &[&str]) -> Redecide {
        Redecide::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_pattern_matches_the_path_or_a_tail_of_it() {
        let x = r(&["level3/002*", "level2/007_masked_softmax_attention_bf16.py"]);
        assert!(x.matches("problems/level3/002_multihead_attention_bf16.py"));
        assert!(x.matches("level3/002_multihead_attention_bf16.py"));
        assert!(x.matches("/abs/problems/level2/007_masked_softmax_attention_bf16.py"));
        assert!(!x.matches("problems/level3/003_transformer_encoder_prenorm_bf16.py"));
        assert!(!r(&["level3/002_a.py"]).matches("problems/level3/002_a.py.bak"), "a tail is matched whole");
        assert!(r(&["*attention*"]).matches("problems/level3/002_multihead_attention_bf16.py"));
        assert!(r(&["level?/01?_*"]).matches("p/level1/012_groupnorm_fp32.py"));
        assert!(!r(&["level?/01?_*"]).matches("p/level1/002_x.py"));
        assert!(!r(&["evel3/002*"]).matches("problems/level3/002_x.py"), "tails start after a /");
    }

    #[test]
    fn an_empty_pattern_or_one_matching_nothing_is_named() {
        let e = Redecide::new(&[" ".to_string()]).unwrap_err();
        assert!(e.to_string().contains("--redecide: an empty pattern"), "{e}");
        let x = r(&["level3/002*", "level9/*"]);
        let problems = vec!["problems/level3/002_a.py".to_string(), "problems/level3/003_b.py".to_string()];
        assert_eq!(x.unmatched(&problems), Some("level9/*"));
        assert_eq!(r(&["level3/*"]).unmatched(&problems), None);
        assert!(Redecide::default().is_empty() && !Redecide::default().matches("a.py"));
    }
}
