//! Chat templates from `tokenizer_config.json` (or GGUF's `tokenizer.chat_template`) rendered with
//! minijinja the way transformers renders them: trim_blocks and lstrip_blocks, loop controls,
//! `raise_exception`, `strftime_now`, Python string methods, and a `tojson` that does not HTML-escape.

use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::Serialize;

use crate::error::{DriftError, Result};

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    pub bos_token: String,
    pub eos_token: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| {
                DriftError::Other(format!("the model's chat template does not parse: {e}"))
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Reads `chat_template`, `bos_token` and `eos_token` from a tokenizer_config.json value. Returns None
    /// when the config has no template (the model is then prompted with raw text).
    pub fn from_tokenizer_config(cfg: &serde_json::Value) -> Result<Option<ChatTemplate>> {
        let source = match &cfg["chat_template"] {
            serde_json::Value::String(s) => Some(s.clone()),
            // A list of named templates: take "default".
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .or(list.first())
                .and_then(|t| t["template"].as_str().map(String::from)),
            _ => None,
        };
        let token = |key: &str| match &cfg[key] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        source
            .map(|s| ChatTemplate::new(&s, &token("bos_token"), &token("eos_token")))
            .transpose()
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| DriftError::Other(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| DriftError::Other(format!("chat template failed: {e}")))
    }
}

/// `json.dumps(value, ensure_ascii=False)` with optional indent, like transformers' tojson.
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = match indent {
        Some(n) => {
            let mut buf = Vec::new();
            let ind = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&ind);
            let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
            json.serialize(&mut ser)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            String::from_utf8_lossy(&buf).into_owned()
        }
        // Python's default separators put a space after ':' and ','.
        None => python_json(&json),
    };
    Ok(Value::from_safe_string(text))
}

fn python_json(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Array(a) => format!(
            "[{}]",
            a.iter().map(python_json).collect::<Vec<_>>().join(", ")
        ),
        serde_json::Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!(
                    "{}: {}",
                    serde_json::Value::String(k.clone()),
                    python_json(v)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// The formats chat templates use (`%d %b %Y`, `%Y-%m-%d`), from the system clock in UTC.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = civil_from_days(secs.div_euclid(86400));
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    const FULL: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    fmt.replace("%d", &format!("{d:02}"))
        .replace("%m", &format!("{m:02}"))
        .replace("%Y", &y.to_string())
        .replace("%b", MONTHS[(m - 1) as usize])
        .replace("%B", FULL[(m - 1) as usize])
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    // SmolLM2-Instruct's template (ChatML with a default system prompt).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_with_generation_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t.render(&[Message::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_and_python_methods() {
        let t = ChatTemplate::new(
            "{% if messages[0].role == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}{{ messages[0].content.strip() | tojson }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  a<b  ")], false).unwrap(),
            "\"a<b\""
        );
        let e = t.render(&[Message::new("bad", "x")], false).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"));
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20786), (2026, 11, 29));
    }
}
