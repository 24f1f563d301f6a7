//! Words for people: counts with their noun in the right number.

/// `n` and its noun: `count(1, "GPU", "GPUs")` is `1 GPU`, `count(3, …)` `3 GPUs`,
/// `count(0, …)` `0 GPUs`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", noun(n, one, many))
}

/// The noun alone, in the number `n` asks for.
pub fn noun<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_naturally() {
        assert_eq!(count(1, "GPU", "GPUs"), "1 GPU");
        assert_eq!(count(0, "GPU", "GPUs"), "0 GPUs");
        assert_eq!(count(2, "step", "steps"), "2 steps");
        assert_eq!(count(1, "request is", "requests are"), "1 request is");
        assert_eq!(noun(7, "slice", "slices"), "slices");
    }
}
