//! Bounds on YAML a bag holds (metadata.yaml, QoS profile text) before it is parsed.
//!
//! The YAML parser's time grows steeply with nesting: a 200 KB metadata.yaml of 100,000 `[`
//! stalled `info` and `play` for over 30 s. rosbag2 nests its metadata 8 levels deep, so the
//! text is scanned first (one pass, no allocation per byte) and refused when its flow
//! collections (`[`, `{`) or its block structure (indentation, `- ` entries) nest deeper
//! than [`MAX_DEPTH`].

/// The deepest nesting accepted, flow and block each. rosbag2 writes 8 at most.
pub const MAX_DEPTH: usize = 64;

/// Refuse `text` when it nests deeper than `max`, with the line where it does. The scan
/// follows YAML's lexical rules as far as nesting depends on them: quoted scalars, comments,
/// block scalars (`|`, `>`: their content is text), and plain scalars, in which `[` or `'`
/// is just a character. Where it cannot tell (a line of a multi-line plain scalar starting
/// with a quote), it errs towards counting more nesting, never less: inside flow
/// collections, where a `]` in a quote would otherwise hide real nesting, quotes and value
/// starts carry across lines exactly; outside them, a quote ends with its line.
pub fn check_depth(text: &str, max: usize) -> Result<(), String> {
    let deep = |line: usize, what: &str| {
        Err(format!(
            "nested more than {max} levels deep ({what}, line {line}); not parsed"
        ))
    };
    // Block indentation columns open at the current line.
    let mut blocks: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    // Inside a quoted scalar: its quote character.
    let mut quote: Option<u8> = None;
    // Inside a block scalar whose parent line is indented this much.
    let mut block_scalar: Option<usize> = None;
    let mut at_value = true;
    for (n, line) in text.split('\n').enumerate() {
        let n = n + 1;
        let b = line.as_bytes();
        let indent = b.iter().take_while(|&&c| c == b' ').count();
        let blank = b[indent..].iter().all(|c| c.is_ascii_whitespace());
        if let Some(parent) = block_scalar {
            if blank || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        let mut i = indent;
        if flow == 0 {
            quote = None;
            // A value starts here: a quote or a flow collection may open.
            at_value = true;
            if blank || b[indent] == b'#' {
                continue;
            }
            while blocks.last().is_some_and(|&c| c > indent) {
                blocks.pop();
            }
            if blocks.last() != Some(&indent) {
                blocks.push(indent);
            }
            // Compact nesting on one line: `- - - x`, `? - x`.
            while i < b.len()
                && matches!(b[i], b'-' | b'?')
                && b.get(i + 1).is_none_or(|c| *c == b' ')
            {
                i += 1;
                while i < b.len() && b[i] == b' ' {
                    i += 1;
                }
                blocks.push(i);
            }
            if blocks.len() > max {
                return deep(n, "block structure");
            }
        }
        while i < b.len() {
            let c = b[i];
            if let Some(q) = quote {
                match c {
                    b'\\' if q == b'"' => i += 1,
                    b'\'' if q == b'\'' && b.get(i + 1) == Some(&b'\'') => i += 1,
                    _ if c == q => {
                        quote = None;
                        at_value = false;
                    }
                    _ => {}
                }
                i += 1;
                continue;
            }
            match c {
                b' ' | b'\t' => {}
                b'#' if i == 0 || matches!(b[i - 1], b' ' | b'\t') => break,
                b'\'' | b'"' if at_value => quote = Some(c),
                b'[' | b'{' if at_value || flow > 0 => {
                    flow += 1;
                    if flow > max {
                        return deep(n, "flow collections");
                    }
                    at_value = true;
                }
                b']' | b'}' if flow > 0 => {
                    flow -= 1;
                    at_value = false;
                }
                b',' if flow > 0 => at_value = true,
                b':' if b.get(i + 1).is_none_or(|c| matches!(c, b' ' | b'\t')) || flow > 0 => {
                    at_value = true
                }
                b'-' | b'?' if at_value && b.get(i + 1).is_none_or(|c| *c == b' ') => {}
                // A tag or an anchor before a value: the value still starts after it.
                b'!' | b'&' if at_value => {
                    while i + 1 < b.len() && !matches!(b[i + 1], b' ' | b'\t') {
                        i += 1;
                    }
                }
                b'|' | b'>' if at_value && flow == 0 => {
                    block_scalar = Some(indent);
                    break;
                }
                _ => at_value = false,
            }
            i += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rosbag2_metadata_of_both_flavours_passes() {
        use crate::bag::metadata::BagMetadata;
        use crate::bag::Flavour;
        for f in [Flavour::Humble, Flavour::Jazzy] {
            let mut m = BagMetadata::empty(f);
            m.topics.push(crate::bag::metadata::TopicWithCount {
                topic: crate::bag::TopicInfo {
                    name: "/it's [odd] {x}".into(),
                    type_name: "std_msgs/msg/String".into(),
                    serialization_format: "cdr".into(),
                    offered_qos_profiles: vec![crate::bag::QosProfile::default()],
                    type_description_hash: String::new(),
                },
                message_count: 1,
            });
            m.custom_data.insert("k".into(), "a\n'b' [c\n  - d".into());
            check_depth(&m.to_yaml(f), 8).unwrap();
        }
    }

    #[test]
    fn deep_flow_and_block_nesting_is_refused_and_text_is_not_nesting() {
        let flow = "[".repeat(100_000);
        assert!(check_depth(&flow, MAX_DEPTH).unwrap_err().contains("flow"));
        let obj = format!("a: {}", "{b: ".repeat(65));
        assert!(check_depth(&obj, MAX_DEPTH).is_err());
        let dashes = "- ".repeat(65) + "x";
        assert!(check_depth(&dashes, MAX_DEPTH)
            .unwrap_err()
            .contains("block"));
        let indented: String = (0..65)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(check_depth(&indented, MAX_DEPTH).is_err());
        // Brackets inside quotes, plain scalars, comments and block scalars are text.
        let text = format!(
            "a: x[{0}\nb: '{0}'\nc: \"{0}\"\n# {0}\nd: |\n  {0}\n  it's\ne: [1, '{0}']\n",
            "[".repeat(100)
        );
        check_depth(&text, MAX_DEPTH).unwrap();
    }
}
