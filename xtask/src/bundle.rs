//! The UI bundle as the server publishes it: content-hashed file names (so browsers may
//! cache them for a year) with brotli and gzip twins beside them (served by content
//! negotiation, `tower_http::services::ServeDir::precompressed_*`).

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The module name the split wasm imports its chunk loaders from, as wasm_split_helpers
/// writes it: 22 placeholder characters, replaced in place (the wasm keeps its length) by
/// the hash and `.split`.
pub const LOADER_PLACEHOLDER: &str = "__wasm_split.______________________.js";

/// How the loader module names the main module until its name is known.
pub const MAIN_PLACEHOLDER: &str = "./__tessera_main__.js";

/// What wasm-bindgen (and wasm-opt) made, and the stylesheet.
pub struct Parts {
    pub js: Vec<u8>,
    pub wasm: Vec<u8>,
    pub css: Vec<u8>,
    /// The lazily loaded pages (`cargo xtask build` always splits; None for an unsplit
    /// bundle).
    pub split: Option<Split>,
}

/// wasm-split's output beside the main module.
pub struct Split {
    /// The JavaScript module that fetches and links chunks (imports [`MAIN_PLACEHOLDER`]).
    pub loader: Vec<u8>,
    /// Each chunk's file stem and bytes.
    pub chunks: Vec<(String, Vec<u8>)>,
    /// For each split point (a group of lazy pages, `<group>_<hash>`), the chunk stems it
    /// needs.
    pub needs: BTreeMap<String, Vec<String>>,
}

/// Replaces `pkg`'s contents with `<name>.<hash>.js`, `<name>.<hash>_bg.wasm` and
/// `<name>.<hash>.css` (one hash over all parts: they change together), each with `.br`
/// and `.gz` twins, and `<name>.css` for the server's few static pages. The server finds
/// the name by its `.js` file. A debug build gets fast compression levels (its wasm is
/// tens of MB); a release build the smallest.
///
/// A split bundle adds `__wasm_split.<hash>.split.js` (the chunk loader), each chunk as
/// `<chunk>.<hash>.wasm`, and `<name>.<hash>.split.json`: the loader's name and, for each
/// group of lazy pages (the split point's name without its `_<hash>`), the chunks it needs,
/// for the server's preload links.
pub fn publish(parts: &Parts, name: &str, pkg: &Path, release: bool) -> Result<()> {
    let mut hashed: Vec<&[u8]> = vec![&parts.js, &parts.wasm, &parts.css];
    if let Some(split) = &parts.split {
        hashed.push(&split.loader);
        hashed.extend(split.chunks.iter().map(|(_, b)| &b[..]));
    }
    let hash = format!("{:016x}", fnv1a(&hashed));
    let stem = format!("{name}.{hash}");
    if pkg.exists() {
        std::fs::remove_dir_all(pkg).with_context(|| format!("clearing {}", pkg.display()))?;
    }
    std::fs::create_dir_all(pkg)?;
    std::fs::write(pkg.join(format!("{name}.css")), &parts.css)?;
    let (brotli_quality, gzip_level) = if release { (11, 9) } else { (1, 1) };
    let mut files = vec![
        (format!("{stem}.js"), parts.js.clone()),
        (format!("{stem}_bg.wasm"), parts.wasm.clone()),
        (format!("{stem}.css"), parts.css.clone()),
    ];
    if let Some(split) = &parts.split {
        let loader = LOADER_PLACEHOLDER.replace("______________________", &format!("{hash}.split"));
        debug_assert_eq!(loader.len(), LOADER_PLACEHOLDER.len());
        // The main wasm imports the loader by module name, and the js glue keys its imports
        // by that name; its `import` statements need a relative path.
        files[0].1 = replace(
            &files[0].1,
            format!("from \"{LOADER_PLACEHOLDER}\"").as_bytes(),
            format!("from \"./{loader}\"").as_bytes(),
        );
        for (_, bytes) in &mut files[..2] {
            *bytes = replace(bytes, LOADER_PLACEHOLDER.as_bytes(), loader.as_bytes());
        }
        let mut js = replace(
            &split.loader,
            MAIN_PLACEHOLDER.as_bytes(),
            format!("./{stem}.js").as_bytes(),
        );
        for (chunk, bytes) in &split.chunks {
            js = replace(
                &js,
                format!("\"./{chunk}.wasm\"").as_bytes(),
                format!("\"./{chunk}.{hash}.wasm\"").as_bytes(),
            );
            files.push((format!("{chunk}.{hash}.wasm"), bytes.clone()));
        }
        let needs: Vec<String> = split
            .needs
            .iter()
            .map(|(point, chunks)| {
                let list: Vec<String> = chunks.iter().map(|c| format!("\"{c}.{hash}\"")).collect();
                format!("\n    \"{}\": [{}]", group(point), list.join(", "))
            })
            .collect();
        let needs = needs.join(",");
        files.push((loader.clone(), js));
        std::fs::write(
            pkg.join(format!("{stem}.split.json")),
            format!("{{\n  \"loader\": \"{loader}\",\n  \"needs\": {{{needs}\n  }}\n}}\n"),
        )?;
    }
    for (file, bytes) in &files {
        std::fs::write(pkg.join(file), bytes)?;
        let br = brotli(bytes, brotli_quality)?;
        std::fs::write(pkg.join(format!("{file}.br")), &br)?;
        let gz = gzip(bytes, gzip_level)?;
        std::fs::write(pkg.join(format!("{file}.gz")), &gz)?;
        eprintln!(
            "    {file}: {} KiB (brotli {} KiB, gzip {} KiB)",
            bytes.len() / 1024,
            br.len() / 1024,
            gz.len() / 1024
        );
    }
    Ok(())
}

fn brotli(bytes: &[u8], quality: u32) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut out, 1 << 16, quality, 22);
        w.write_all(bytes)?;
    }
    Ok(out)
}

fn gzip(bytes: &[u8], level: u32) -> Result<Vec<u8>> {
    let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    w.write_all(bytes)?;
    Ok(w.finish()?)
}

/// The group a split point belongs to: `work_16878108156359909555` → `work` (Leptos's
/// `#[lazy]` appends a hash of where the function is written).
fn group(point: &str) -> &str {
    point
        .rsplit_once('_')
        .filter(|(_, hash)| !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_digit()))
        .map_or(point, |(group, _)| group)
}

/// `bytes` with every `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(at) = rest.windows(from.len()).position(|w| w == from) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to);
        rest = &rest[at + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// 64-bit FNV-1a over the parts: a cache key, not a security property.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_point_names_its_group() {
        assert_eq!(group("work_16878108156359909555"), "work");
        assert_eq!(group("join_tokens_42"), "join_tokens");
        assert_eq!(group("admin"), "admin");
        assert_eq!(group("admin_"), "admin_");
    }

    #[test]
    fn the_name_follows_the_content_and_the_twins_decompress_to_it() {
        let dir = std::env::temp_dir().join(format!("tessera-bundle-{}", std::process::id()));
        let parts = |js: &str| Parts {
            js: js.as_bytes().to_vec(),
            wasm: b"\0asm wasm".to_vec(),
            css: b"body{}".to_vec(),
            split: None,
        };
        publish(&parts("export {}"), "t", &dir, false).expect("publish");
        let names = |dir: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .expect("dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let first = names(&dir);
        assert_eq!(first.len(), 10, "{first:?}");
        let js = first
            .iter()
            .find(|n| n.ends_with(".js"))
            .expect("js")
            .clone();
        assert!(
            js.starts_with("t.") && js.len() == "t.".len() + 16 + ".js".len(),
            "{js}"
        );
        let stem = js.trim_end_matches(".js");
        assert!(first.contains(&format!("{stem}_bg.wasm.br")), "{first:?}");

        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(
                &std::fs::read(dir.join(format!("{js}.gz"))).expect("gz")[..],
            ),
            &mut text,
        )
        .expect("gunzip");
        assert_eq!(text, "export {}");
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut brotli::Decompressor::new(
                &std::fs::read(dir.join(format!("{js}.br"))).expect("br")[..],
                4096,
            ),
            &mut text,
        )
        .expect("unbrotli");
        assert_eq!(text, "export {}");

        // New content: a new name, and the old files are gone.
        publish(&parts("export {x}"), "t", &dir, false).expect("publish again");
        let second = names(&dir);
        assert_eq!(second.len(), 10);
        assert!(second.iter().all(|n| !n.starts_with(stem)), "{second:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
