//! `json-call`: a dynamic call, its method named at run time and its request read from JSON.
//!
//! The request is turned into airlock's closed `Value` model, sent with `Host::call_value`,
//! and the answer printed back as JSON. A worker serves such a method with
//! `Worker::value_method`; the bundled `airlock-worker`'s is `echo_value`.
//!
//! Usage: `json-call <worker> <method> <json>`, e.g.
//! `json-call target/debug/airlock-worker echo_value '{"size": [640, 480], "name": "cat"}'`

use std::collections::BTreeMap;

use airlock_host::{Host, Key, Value};
use serde_json::Value as Json;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (Some(worker), Some(method), Some(json)) = (args.next(), args.next(), args.next()) else {
        return Err("usage: json-call <worker> <method> <json>".into());
    };
    let request = to_value(serde_json::from_str(&json)?);
    let host = Host::builder(&worker).spawn().await?;
    let answer = host.call_value(&method, &request).await;
    host.shutdown().await;
    println!("{}", to_json(answer?));
    Ok(())
}

/// JSON to `Value`: integers stay integers (signed when negative), other numbers are floats,
/// objects become maps with string keys.
fn to_value(json: Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(b),
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Value::U64(u),
            (None, Some(i)) => Value::I64(i),
            _ => Value::F64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::Str(s),
        Json::Array(items) => Value::List(items.into_iter().map(to_value).collect()),
        Json::Object(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Key::Str(k), to_value(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

/// `Value` to JSON, for printing: bytes become arrays of numbers, integer keys strings, and a
/// float JSON cannot hold (NaN, infinities) `null`.
fn to_json(value: Value) -> Json {
    match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(b),
        Value::I64(i) => Json::from(i),
        Value::U64(u) => Json::from(u),
        Value::F64(f) => serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number),
        Value::Str(s) => Json::String(s),
        Value::Bytes(bytes) => Json::Array(bytes.into_iter().map(Json::from).collect()),
        Value::List(items) => Json::Array(items.into_iter().map(to_json).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .into_iter()
                .map(|(key, v)| {
                    let key = match key {
                        Key::Str(s) => s,
                        Key::I64(i) => i.to_string(),
                        Key::U64(u) => u.to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
    }
}
