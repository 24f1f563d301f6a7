//! `tessera plan`: JSON in, JSON out, and errors that name the file, line
//! and field. The server wires this to the command line; reading the files
//! stays there.

use serde::de::DeserializeOwned;

use super::input::{Cluster, InputError, Request};
use super::plan;
use crate::mig::Catalog;

/// Bad input to `tessera plan`, located as `file:line:column: field: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {field}: {message}")]
pub struct PlanInputError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// JSON path of the offending field, e.g. `nodes[0].gpus[1].mode`.
    pub field: String,
    pub message: String,
}

/// Parses CLUSTER.json and REQUESTS.json, plans with the built-in catalog
/// (plus any `models` tables in the cluster file) and returns the plan as
/// pretty JSON. `*_name` are the file names used in error messages.
pub fn run_plan(
    cluster_json: &str,
    cluster_name: &str,
    requests_json: &str,
    requests_name: &str,
) -> Result<String, PlanInputError> {
    let cluster: Cluster = parse(cluster_json, cluster_name)?;
    let requests: Vec<Request> = parse(requests_json, requests_name)?;
    let planned = plan(&cluster, &requests, &Catalog::builtin()).map_err(|e| {
        // Request paths start with an index; cluster paths with a key.
        if e.path.starts_with('[') {
            locate_error(requests_json, requests_name, e)
        } else {
            locate_error(cluster_json, cluster_name, e)
        }
    })?;
    serde_json::to_string_pretty(&planned).map_err(|e| PlanInputError {
        file: String::new(),
        line: 0,
        column: 0,
        field: String::new(),
        message: e.to_string(),
    })
}

fn parse<T: DeserializeOwned>(text: &str, name: &str) -> Result<T, PlanInputError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        json_error(name, &field, &inner)
    })?;
    de.end().map_err(|e| json_error(name, ".", &e))?;
    Ok(value)
}

fn json_error(name: &str, field: &str, e: &serde_json::Error) -> PlanInputError {
    let text = e.to_string();
    let message = match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    };
    PlanInputError {
        file: name.to_owned(),
        line: e.line(),
        column: e.column(),
        field: if field.is_empty() {
            ".".to_owned()
        } else {
            field.to_owned()
        },
        message,
    }
}

fn locate_error(text: &str, name: &str, e: InputError) -> PlanInputError {
    let (line, column) = locate(text, &e.path).unwrap_or((0, 0));
    PlanInputError {
        file: name.to_owned(),
        line,
        column,
        field: e.path,
        message: e.message,
    }
}

#[derive(Debug, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

fn segments(path: &str) -> Option<Vec<Segment>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if !key.is_empty() {
            out.push(Segment::Key(key.to_owned()));
        }
        for idx in rest.split('[').filter(|s| !s.is_empty()) {
            out.push(Segment::Index(idx.trim_end_matches(']').parse().ok()?));
        }
    }
    Some(out)
}

/// 1-based line and column where the value at `path` starts in `text`.
fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let mut pos = skip_ws(b, 0);
    for seg in segments(path)? {
        match seg {
            Segment::Key(k) => {
                if b.get(pos) != Some(&b'{') {
                    return None;
                }
                pos = skip_ws(b, pos + 1);
                loop {
                    let key_end = skip_value(b, pos)?;
                    let key = text.get(pos + 1..key_end - 1)?;
                    pos = skip_ws(b, key_end);
                    if b.get(pos) != Some(&b':') {
                        return None;
                    }
                    pos = skip_ws(b, pos + 1);
                    if key == k {
                        break;
                    }
                    pos = skip_ws(b, skip_value(b, pos)?);
                    if b.get(pos) != Some(&b',') {
                        return None;
                    }
                    pos = skip_ws(b, pos + 1);
                }
            }
            Segment::Index(i) => {
                if b.get(pos) != Some(&b'[') {
                    return None;
                }
                pos = skip_ws(b, pos + 1);
                for _ in 0..i {
                    pos = skip_ws(b, skip_value(b, pos)?);
                    if b.get(pos) != Some(&b',') {
                        return None;
                    }
                    pos = skip_ws(b, pos + 1);
                }
            }
        }
    }
    let before = text.get(..pos)?;
    let line = before.matches('\n').count() + 1;
    let column = pos - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    Some((line, column))
}

fn skip_ws(b: &[u8], mut pos: usize) -> usize {
    while b.get(pos).is_some_and(u8::is_ascii_whitespace) {
        pos += 1;
    }
    pos
}

/// The position just after the JSON value starting at `pos`.
fn skip_value(b: &[u8], pos: usize) -> Option<usize> {
    match b.get(pos)? {
        b'"' => {
            let mut i = pos + 1;
            loop {
                match b.get(i)? {
                    b'\\' => i += 2,
                    b'"' => return Some(i + 1),
                    _ => i += 1,
                }
            }
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = pos;
            loop {
                match b.get(i)? {
                    b'"' => {
                        i = skip_value(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = pos;
            while b
                .get(i)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
            {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CLUSTER: &str = r#"{"nodes":[{"name":"n1","cpu_milli":64000,"memory_mib":262144,"gpus":[
   {"index":0,"model":"H100-80GB","mode":"mig","reconfigurable":true,
    "instances":[{"profile":"3g.40gb","start":0,"busy":true}]}]}]}"#;

    #[test]
    fn a_type_error_names_file_line_and_field() {
        let bad = CLUSTER.replace("\"mode\":\"mig\"", "\"mode\":\"migg\"");
        let err = run_plan(&bad, "CLUSTER.json", "[]", "REQUESTS.json").unwrap_err();
        assert_eq!(err.file, "CLUSTER.json");
        assert_eq!(err.line, 2);
        assert_eq!(err.field, "nodes[0].gpus[0].mode");
        assert!(err.to_string().starts_with("CLUSTER.json:2:"), "{err}");
    }

    #[test]
    fn a_semantic_error_is_located_too() {
        let bad = CLUSTER.replace("\"start\":0", "\"start\":2");
        let err = run_plan(&bad, "c.json", "[]", "r.json").unwrap_err();
        assert_eq!(
            (err.line, err.field.as_str()),
            (3, "nodes[0].gpus[0].instances[0]")
        );
        assert!(err.message.contains("3g.40gb@2"), "{err}");

        let reqs = "[{\"id\":\"a\",\"gpus\":1},\n {\"id\":\"b\",\"gpus\":0}]";
        let err = run_plan(CLUSTER, "c.json", reqs, "r.json").unwrap_err();
        assert_eq!(err.to_string(), "r.json:2:19: [1].gpus: must be at least 1");
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let err = run_plan(CLUSTER, "c.json", r#"[{"id":"a","gpu":1}]"#, "r.json").unwrap_err();
        assert_eq!(err.field, "[0].gpu");
        assert!(err.message.contains("unknown field `gpu`"), "{err}");
    }

    #[test]
    fn locate_walks_keys_and_indices() {
        let text = "{\"a\": [1, {\"b\": \"x,]\"}],\n \"c\": {\"d\": 2}}";
        assert_eq!(locate(text, "a[1].b"), Some((1, 17)));
        assert_eq!(locate(text, "c.d"), Some((2, 13)));
        assert_eq!(locate(text, "zz"), None);
    }
}
