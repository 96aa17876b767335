//! A tiny WGSL preprocessor: `#if NAME` / `#ifnot NAME` / `#else` / `#endif` blocks (nestable; a name is
//! true when defined and not "0"), and `{{NAME}}` substitution.

use crate::error::{DriftError, Result};

pub fn preprocess(source: &str, defines: &[(&str, String)]) -> Result<String> {
    let lookup = |name: &str| {
        defines
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    };
    let truthy = |name: &str| lookup(name).is_some_and(|v| v != "0" && v != "false");
    let mut out = String::with_capacity(source.len());
    // Stack of (this block active, any branch taken) for nested #if.
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |s: &Vec<(bool, bool)>| s.iter().all(|(a, _)| *a);
    for (n, line) in source.lines().enumerate() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("#ifnot ") {
            let v = !truthy(name.trim());
            stack.push((v, v));
        } else if let Some(name) = t.strip_prefix("#if ") {
            let v = truthy(name.trim());
            stack.push((v, v));
        } else if t.starts_with("#else") {
            let top = stack
                .last_mut()
                .ok_or_else(|| err(n, "#else without #if"))?;
            *top = (!top.1, true);
        } else if t.starts_with("#endif") {
            stack.pop().ok_or_else(|| err(n, "#endif without #if"))?;
        } else if active(&stack) {
            out.push_str(&substitute(line, &lookup).map_err(|m| err(n, &m))?);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(err(source.lines().count(), "unterminated #if"));
    }
    Ok(out)
}

fn substitute<'a>(
    line: &str,
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let j = rest[i..].find("}}").ok_or("unclosed {{")? + i;
        let name = &rest[i + 2..j];
        out.push_str(lookup(name).ok_or_else(|| format!("{{{{{name}}}}} is not defined"))?);
        rest = &rest[j + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn err(line: usize, msg: &str) -> DriftError {
    DriftError::Shader {
        name: "preprocessor".into(),
        message: format!("line {}: {msg}", line + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_substitution() {
        let src = "a {{T}}\n#if F16\nenable f16;\n#else\nno\n#endif\n#ifnot SG\nplain\n#endif\n";
        let out = preprocess(src, &[("T", "f16".into()), ("F16", "1".into())]).unwrap();
        assert_eq!(out, "a f16\nenable f16;\nplain\n");
        let out = preprocess(
            src,
            &[("T", "f32".into()), ("F16", "0".into()), ("SG", "1".into())],
        )
        .unwrap();
        assert_eq!(out, "a f32\nno\n");
    }

    #[test]
    fn errors_are_reported() {
        assert!(preprocess("{{X}}", &[]).is_err());
        assert!(preprocess("#if A\n", &[]).is_err());
        assert!(preprocess("#endif\n", &[]).is_err());
    }
}
