//! Just enough XML for the S3 answers rusty-s3 does not parse: error bodies and
//! ListMultipartUploads. S3's answers are flat, namespaced-by-default documents whose leaf
//! elements hold escaped text, so finding `<Name>…</Name>` is exact for them.

/// The unescaped text of the first `<name>…</name>` in `xml`.
pub fn text(xml: &str, name: &str) -> Option<String> {
    blocks(xml, name).next().map(unescape)
}

/// The inner text of every `<name>…</name>` (not nested in one another), in order.
pub fn blocks<'a>(xml: &'a str, name: &str) -> impl Iterator<Item = &'a str> + 'a {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let inner = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(inner)
    })
}

pub fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}
