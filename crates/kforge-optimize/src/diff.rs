//! A line diff of two texts, for the report's "what the result changes": the winner's result
//! file against the problem's source. Longest common subsequence over lines (dynamic
//! programming after the common head and tail are taken off; the texts are source files of at
//! most a few thousand lines), grouped into hunks with context lines as a unified diff groups
//! them.

/// One line of a diff: kept, removed from the old text or added in the new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// A run of changed lines with up to `context` kept lines around it, and where it starts in
/// each text (1-based line numbers, as a unified diff's header gives them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk<'a> {
    pub old_start: usize,
    pub new_start: usize,
    pub lines: Vec<Line<'a>>,
}

/// The cells past which the middle of two texts is not compared line by line: it is then shown
/// as removed and added whole (a bound on memory, 64 MiB of u32, never reached by source files).
const MAX_CELLS: usize = 16 << 20;

/// Every line of `old` and `new` in order, each kept, removed or added.
pub fn lines<'a>(old: &'a str, new: &'a str) -> Vec<Line<'a>> {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (ma, mb) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut out: Vec<Line> = a[..head].iter().map(|l| Line::Same(l)).collect();
    out.extend(middle(ma, mb));
    out.extend(a[a.len() - tail..].iter().map(|l| Line::Same(l)));
    out
}

/// The middle part's diff by the longest common subsequence.
fn middle<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Line<'a>> {
    let (n, m) = (a.len(), b.len());
    if (n + 1).saturating_mul(m + 1) > MAX_CELLS {
        return a.iter().map(|l| Line::Removed(l)).chain(b.iter().map(|l| Line::Added(l))).collect();
    }
    // common[i][j]: the longest common subsequence of a[i..] and b[j..].
    let width = m + 1;
    let mut common = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            common[i * width + j] = if a[i] == b[j] {
                common[(i + 1) * width + j + 1] + 1
            } else {
                common[(i + 1) * width + j].max(common[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::with_capacity(n + m));
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push(Line::Same(a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || common[(i + 1) * width + j] >= common[i * width + j + 1]) {
            out.push(Line::Removed(a[i])); // removed before added, as a unified diff reads
            i += 1;
        } else {
            out.push(Line::Added(b[j]));
            j += 1;
        }
    }
    out
}

/// The changes of `old` to `new` as hunks, each with up to `context` kept lines before and after
/// (hunks closer than twice that are one). None when the texts' lines are equal.
pub fn hunks<'a>(old: &'a str, new: &'a str, context: usize) -> Vec<Hunk<'a>> {
    let all = lines(old, new);
    let changed: Vec<usize> = (0..all.len()).filter(|&k| !matches!(all[k], Line::Same(_))).collect();
    let mut spans: Vec<(usize, usize)> = Vec::new(); // [start, end) in `all`
    for &k in &changed {
        let (start, end) = (k.saturating_sub(context), (k + 1 + context).min(all.len()));
        match spans.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => spans.push((start, end)),
        }
    }
    spans.into_iter().map(|(start, end)| hunk_at(&all, start, end)).collect()
}

/// The hunk of `all[start..end]`, with its starting line numbers counted from the lines before it.
fn hunk_at<'a>(all: &[Line<'a>], start: usize, end: usize) -> Hunk<'a> {
    let before = &all[..start];
    let old_start = 1 + before.iter().filter(|l| !matches!(l, Line::Added(_))).count();
    let new_start = 1 + before.iter().filter(|l| !matches!(l, Line::Removed(_))).count();
    Hunk { old_start, new_start, lines: all[start..end].to_vec() }
}

impl Hunk<'_> {
    /// Its lines in the old text and in the new one (a unified diff header's counts).
    pub fn lengths(&self) -> (usize, usize) {
        let old = self.lines.iter().filter(|l| !matches!(l, Line::Added(_))).count();
        (old, self.lines.iter().filter(|l| !matches!(l, Line::Removed(_))).count())
    }
}

/// Lines added and removed in all of `hunks`.
pub fn counts(hunks: &[Hunk]) -> (usize, usize) {
    let each = |f: fn(&Line) -> bool| hunks.iter().flat_map(|h| &h.lines).filter(|l| f(l)).count();
    (each(|l| matches!(l, Line::Added(_))), each(|l| matches!(l, Line::Removed(_))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The diff applied to the old text gives the new one, and its kept lines are a common
    /// subsequence of both.
    fn check(old: &str, new: &str) -> Vec<Line<'static>> {
        let d = lines(old, new);
        let rebuilt_new: Vec<&str> =
            d.iter().filter_map(|l| if let Line::Removed(_) = l { None } else { Some(text(l)) }).collect();
        let rebuilt_old: Vec<&str> =
            d.iter().filter_map(|l| if let Line::Added(_) = l { None } else { Some(text(l)) }).collect();
        assert_eq!(rebuilt_new, new.lines().collect::<Vec<_>>());
        assert_eq!(rebuilt_old, old.lines().collect::<Vec<_>>());
        d.iter()
            .map(|l| match l {
                Line::Same(s) => Line::Same(leak(s)),
                Line::Removed(s) => Line::Removed(leak(s)),
                Line::Added(s) => Line::Added(leak(s)),
            })
            .collect()
    }

    fn text<'a>(l: &Line<'a>) -> &'a str {
        match l {
            Line::Same(s) | Line::Removed(s) | Line::Added(s) => s,
        }
    }

    fn leak(s: &str) -> &'static str {
        Box::leak(s.to_string().into_boxed_str())
    }

    #[test]
    fn a_changed_line_is_removed_then_added_and_the_rest_kept() {
        let d = check("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(d, [Line::Same("a"), Line::Removed("b"), Line::Added("B"), Line::Same("c")]);
        assert_eq!(check("", "x\ny"), [Line::Added("x"), Line::Added("y")]);
        assert_eq!(check("x\ny", ""), [Line::Removed("x"), Line::Removed("y")]);
        assert!(check("same\n", "same\n").iter().all(|l| matches!(l, Line::Same(_))));
    }

    #[test]
    fn the_longest_common_subsequence_is_kept() {
        // Moving a block: the longer run stays, the shorter one moves.
        let old = "import torch\nclass Model:\n    def forward(self, x):\n        return x * 2\nN = 4\n";
        let new = "import torch\nN = 4\nclass Model:\n    def forward(self, x):\n        return x + x\n";
        let d = check(old, new);
        let kept = d.iter().filter(|l| matches!(l, Line::Same(_))).count();
        assert_eq!(kept, 3, "{d:?}");
        for (old, new) in [("a\nb\nc\nd", "b\nd\nc\na"), ("x\nx\nx", "x\ny\nx"), ("1\n2\n3\n4\n5", "5\n4\n3\n2\n1")] {
            check(old, new);
        }
    }

    #[test]
    fn hunks_carry_context_and_line_numbers_and_merge_when_close() {
        let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let new =
            old.replace("line 5\n", "line five\n").replace("line 16\n", "").replace("line 7\n", "line 7\nextra\n");
        let h = hunks(&old, &new, 2);
        assert_eq!(h.len(), 2, "{h:?}"); // 5 and 7 merge; 16 is apart
        assert_eq!((h[0].old_start, h[0].new_start), (3, 3));
        assert_eq!(h[0].lines.first(), Some(&Line::Same("line 3")));
        assert_eq!((h[1].old_start, h[1].new_start), (14, 15));
        assert!(h[1].lines.contains(&Line::Removed("line 16")));
        assert_eq!(counts(&h), (2, 2));
        assert_eq!((h[0].lengths(), h[1].lengths()), ((7, 8), (5, 4)), "{h:?}");
        assert!(hunks(&old, &old, 3).is_empty());
    }
}
