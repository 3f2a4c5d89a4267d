//! Splits the kernels' one PTX file into one self-contained module per op family, so a
//! process JIT-compiles (or loads from the driver's cache) only the families it uses.
//!
//! The family of an entry point is the first `_`-separated word of its name
//! (`matmul_mma_128x128_kk_f16` -> `matmul`). Each module holds the PTX header, the
//! family's entry points, and every top-level item (function, declaration, global) they
//! reach through symbol references, in the original order.

use std::collections::{BTreeMap, BTreeSet};

/// One top-level PTX item: a function (declaration or definition), an entry or a global.
struct Item<'a> {
    text: &'a str,
    /// The symbol the item defines or declares (empty if none was recognised).
    name: &'a str,
}

/// An op family's module: its name and PTX.
pub struct Module {
    pub family: String,
    pub ptx: String,
}

/// The family an entry point belongs to.
pub fn family_of(entry: &str) -> &str {
    entry.split('_').next().unwrap_or(entry)
}

/// Splits `ptx` (one LLVM-generated module) into one module per family of `entries`.
/// Fails with a message if the PTX does not have the expected shape.
pub fn split(ptx: &str, entries: &[String]) -> Result<Vec<Module>, String> {
    let (header, items) = parse(ptx)?;
    let index: BTreeMap<&str, Vec<usize>> = items.iter().enumerate().fold(
        BTreeMap::new(),
        |mut m: BTreeMap<&str, Vec<usize>>, (i, item)| {
            if !item.name.is_empty() {
                m.entry(item.name).or_default().push(i);
            }
            m
        },
    );
    let mut by_family: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in entries {
        by_family.entry(family_of(e)).or_default().push(e);
    }
    let mut modules = Vec::new();
    for (family, roots) in by_family {
        let mut keep = BTreeSet::new();
        let mut todo: Vec<&str> = roots.clone();
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        while let Some(sym) = todo.pop() {
            if !seen.insert(sym) {
                continue;
            }
            let Some(defs) = index.get(sym) else {
                return Err(format!("symbol {sym} is referenced but never declared"));
            };
            for &i in defs {
                keep.insert(i);
                todo.extend(identifiers(items[i].text).filter(|id| index.contains_key(id)));
            }
        }
        let mut text = String::from(header);
        for i in keep {
            text.push('\n');
            text.push_str(items[i].text);
            text.push('\n');
        }
        modules.push(Module {
            family: family.to_string(),
            ptx: text,
        });
    }
    Ok(modules)
}

/// The header (everything up to the first item) and the top-level items.
fn parse(ptx: &str) -> Result<(&str, Vec<Item<'_>>), String> {
    let mut items = Vec::new();
    let mut header_end = None;
    let mut depth = 0usize;
    let mut start: Option<usize> = None;
    let mut offset = 0;
    for line in ptx.split_inclusive('\n') {
        let code = line.split("//").next().unwrap_or("").trim();
        let at = offset;
        offset += line.len();
        if depth == 0 && start.is_none() {
            if code.is_empty() || is_header_directive(code) {
                continue;
            }
            header_end.get_or_insert(at);
            start = Some(at);
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth
                        .checked_sub(1)
                        .ok_or_else(|| format!("unbalanced '}}' in PTX line {line:?}"))?
                }
                _ => {}
            }
        }
        if depth == 0 && (code.ends_with(';') || code.ends_with('}')) {
            let begin = start.take().unwrap_or(at);
            let text = ptx[begin..offset].trim_end();
            items.push(Item {
                text,
                name: defined_name(text),
            });
        }
    }
    if depth != 0 || start.is_some() {
        return Err("the PTX ends inside an item".into());
    }
    let header = &ptx[..header_end.ok_or("the PTX has no items")?];
    Ok((header, items))
}

/// Module-level directives that belong to every module's header.
fn is_header_directive(code: &str) -> bool {
    [".version", ".target", ".address_size", ".extern .shared"]
        .iter()
        .any(|d| code.starts_with(d))
}

/// The symbol a top-level item defines: the identifier before the parameter list of a
/// function or entry, or before the array bounds / initialiser / `;` of a global.
fn defined_name(text: &str) -> &str {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let is_function = code.contains(".entry") || code.contains(".func");
    let mut last = "";
    for id in identifiers(text) {
        if id.starts_with('.') {
            continue;
        }
        // The first identifier after the return-value group, for functions; the last one
        // before `[`, `=` or `;`, for globals: find it by position in `text`.
        let pos = text.find(id).unwrap_or(0);
        let after = text[pos + id.len()..].trim_start();
        if is_function {
            let in_return_group =
                text[..pos].matches('(').count() > text[..pos].matches(')').count();
            if !in_return_group && after.starts_with('(') {
                return id;
            }
        } else if after.starts_with('[') || after.starts_with('=') || after.starts_with(';') {
            return id;
        } else {
            last = id;
        }
    }
    last
}

/// The identifiers (and `.directives`) of a piece of PTX, comments skipped.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.lines().flat_map(|l| {
        l.split("//")
            .next()
            .unwrap_or("")
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '.'))
            .filter(|t| !t.is_empty() && !t.as_bytes()[0].is_ascii_digit())
    })
}
