//! A message type that exercises every shape the typed decoder handles: integers of each width
//! and sign, floats, bool, char, strings, byte strings, options, sequences, tuples, maps, unit
//! and data-carrying enum variants, and a recursive enum that reaches the depth limit.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_bytes::ByteBuf;

/// The fuzzed target type.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Message {
    pub id: u64,
    pub small: u8,
    pub delta: i32,
    pub wide: i128,
    pub ratio: f32,
    pub flag: bool,
    pub letter: char,
    pub name: String,
    pub note: Option<String>,
    pub blob: ByteBuf,
    pub counts: Vec<u32>,
    pub matrix: Vec<Vec<i16>>,
    pub pair: (u16, Option<bool>),
    pub attrs: WireMap<String, Option<i64>>,
    pub kind: Kind,
    pub tree: Tree,
    pub marker: (),
}

/// An enum with every variant shape.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Kind {
    Empty,
    Code(u32),
    Span(u64, u64),
    Named { label: String, weight: f64 },
    Many(Vec<Kind>),
}

/// A recursive type: hostile input nests it until `max_depth` stops it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Tree {
    Leaf(i8),
    Node(Box<Tree>, Box<Tree>),
    Branches(Vec<Tree>),
}

/// A serde map that keeps its entries in wire order, duplicates included.
///
/// A `BTreeMap` would sort and de-duplicate what it reads, so a valid but unsorted input would
/// not re-encode byte for byte; this keeps the fuzz target's round-trip check exact while still
/// driving the decoder's map path.
#[derive(Debug, Clone, PartialEq)]
pub struct WireMap<K, V>(pub Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for WireMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for WireMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<K, V>(PhantomData<(K, V)>);
        impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for Entries<K, V> {
            type Value = WireMap<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                // The size hint comes from the input: it is not trusted for preallocation.
                let mut entries = Vec::new();
                while let Some(entry) = access.next_entry()? {
                    entries.push(entry);
                }
                Ok(WireMap(entries))
            }
        }
        deserializer.deserialize_map(Entries(PhantomData))
    }
}
