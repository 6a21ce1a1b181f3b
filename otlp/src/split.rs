//! Splitting a resource group that is too large for one record into several records,
//! each a complete single-group export request: first between its scopes, then between
//! the items of a scope, so nothing is truncated and every piece decodes on its own.

use bytes::Bytes;

/// A resource group taken apart into what can be divided. `H` holds everything that
/// is repeated in each piece (resource, schema URL, scope description); `I` is one item
/// (a span, a metric or a log record).
#[derive(Clone)]
pub(crate) struct Group<H, I> {
    pub head: H,
    pub scopes: Vec<Scope<H, I>>,
}

#[derive(Clone)]
pub(crate) struct Scope<H, I> {
    pub head: H,
    pub items: Vec<I>,
}

impl<H: Clone, I> Group<H, I> {
    /// Two groups holding half of the scopes each, or, for a single scope, half of its
    /// items each; `None` when the group holds at most one item.
    fn halves(mut self) -> Option<(Self, Self)> {
        if self.scopes.len() > 1 {
            let back = self.scopes.split_off(self.scopes.len() / 2);
            let front = Group {
                head: self.head.clone(),
                scopes: self.scopes,
            };
            let back = Group {
                head: self.head,
                scopes: back,
            };
            return Some((front, back));
        }
        let scope = self.scopes.pop()?;
        if scope.items.len() < 2 {
            return None;
        }
        let mut front_items = scope.items;
        let back_items = front_items.split_off(front_items.len() / 2);
        let piece = |head: H, items| Group {
            head,
            scopes: vec![Scope {
                head: scope.head.clone(),
                items,
            }],
        };
        Some((
            piece(self.head.clone(), front_items),
            piece(self.head, back_items),
        ))
    }
}

/// Encodes `group` as export requests of at most `limit` bytes each, halving it until
/// every piece fits. `None` when a single item (with its resource and scope) is larger
/// than `limit` on its own.
pub(crate) fn pieces<H: Clone, I>(
    group: Group<H, I>,
    limit: usize,
    encode: &dyn Fn(&Group<H, I>) -> Vec<u8>,
) -> Option<Vec<Bytes>> {
    let encoded = encode(&group);
    if encoded.len() <= limit {
        return Some(vec![encoded.into()]);
    }
    let (front, back) = group.halves()?;
    let mut out = pieces(front, limit, encode)?;
    out.extend(pieces(back, limit, encode)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy encoding: the head, then each scope's head and items.
    fn encode(group: &Group<String, String>) -> Vec<u8> {
        let mut out = group.head.clone();
        for scope in &group.scopes {
            out.push_str(&scope.head);
            for item in &scope.items {
                out.push_str(item);
            }
        }
        out.into_bytes()
    }

    fn group(scopes: &[(&str, &[&str])]) -> Group<String, String> {
        Group {
            head: "R".into(),
            scopes: scopes
                .iter()
                .map(|(head, items)| Scope {
                    head: head.to_string(),
                    items: items.iter().map(|i| i.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn texts(pieces: Vec<Bytes>) -> Vec<String> {
        pieces
            .into_iter()
            .map(|p| String::from_utf8(p.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_group_that_fits_stays_whole() {
        let g = group(&[("A", &["1", "2"]), ("B", &["3"])]);
        assert_eq!(texts(pieces(g, 6, &encode).unwrap()), ["RA12B3"]);
    }

    #[test]
    fn splits_between_scopes_then_items_keeping_order_and_heads() {
        let g = group(&[("A", &["11", "22", "33", "44"]), ("B", &["55"])]);
        let out = texts(pieces(g, 6, &encode).unwrap());
        assert_eq!(out, ["RA1122", "RA3344", "RB55"]);
        // Every item is in exactly one piece, in order.
        let items: String = out
            .iter()
            .map(|p| p.trim_start_matches(['R', 'A', 'B']))
            .collect();
        assert_eq!(items, "1122334455");
    }

    #[test]
    fn an_item_too_large_alone_cannot_be_split() {
        let g = group(&[("A", &["1", "2222222"])]);
        assert!(pieces(g, 6, &encode).is_none());
    }
}
