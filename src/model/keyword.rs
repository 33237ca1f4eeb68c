//! Keyword enums: a manifest value spelled as one of a fixed set of words
//! (`overlap = "queue"`, `log_level = "info"`). [`keywords!`] declares the
//! enum with each variant's word once, and derives from that one list what
//! every such enum needs: `NAMES` (the words, in order, for diagnostics and
//! the schema), `ALL`, `parse`, `as_str` and serde's spelling, so the words
//! a diagnostic lists, the parser accepts and serde writes never disagree.

/// Declare a keyword enum: `enum Name { Variant = "word", … }`. Attributes
/// and doc comments on the enum and its variants are kept; each variant is
/// serialized as its word (the enum must derive `Serialize`).
macro_rules! keywords {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* #[serde(rename = $word)] $variant ),+
        }

        impl $name {
            /// Every word, in declaration order.
            pub const NAMES: [&'static str; <[()]>::len(&[$($crate::model::keyword::keywords!(@unit $variant)),+])] =
                [$($word),+];
            /// Every value, in the order of [`Self::NAMES`].
            pub const ALL: [$name; <[()]>::len(&[$($crate::model::keyword::keywords!(@unit $variant)),+])] =
                [$(Self::$variant),+];

            /// The value spelled `word`, if it is one.
            pub fn parse(word: &str) -> Option<Self> {
                match word {
                    $($word => Some(Self::$variant),)+
                    _ => None,
                }
            }

            /// The word for this value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $word),+
                }
            }
        }
    };
    (@unit $variant:ident) => { () };
}

pub(crate) use keywords;

#[cfg(test)]
mod tests {
    use serde::Serialize;

    keywords! {
        /// A test enum.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
        enum Speed {
            Slow = "slow",
            #[default]
            QuiteFast = "quite-fast",
        }
    }

    #[test]
    fn one_list_gives_names_parse_as_str_and_serde_alike() {
        assert_eq!(Speed::NAMES, ["slow", "quite-fast"]);
        assert_eq!(Speed::ALL, [Speed::Slow, Speed::QuiteFast]);
        for (name, value) in Speed::NAMES.iter().zip(Speed::ALL) {
            assert_eq!(Speed::parse(name), Some(value));
            assert_eq!(value.as_str(), *name);
            assert_eq!(serde_json::to_value(value).unwrap(), *name);
        }
        assert_eq!(Speed::parse("Slow"), None);
        assert_eq!(Speed::parse(""), None);
        assert_eq!(Speed::default(), Speed::QuiteFast);
    }
}
