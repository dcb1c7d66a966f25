import PylonPluginKit

/// The uploader records of events, written straight as JSON text.
///
/// An event's record is `{"id", "data": {event, time, euid, session, properties, utm?, device}}`
/// (docs/MA.md, Events and sessions). It used to be built as a json-c tree (about a dozen objects
/// and three hash tables per event) and serialised again inside the enqueue; writing the bytes
/// once into the enqueue's params is what keeps MA's cost per event small and its allocations
/// flat (measured in the anchors' `pylon_ma` row: see the commit that introduced this file).
enum EventText {
    /// The enqueue params up to the first record: `{"stream":…,"consent":…,"records":[`.
    static func paramsHead(stream: String, consent: String, into out: inout [UInt8]) {
        append(#"{"stream":"#, &out)
        JSONText.appendString(stream, to: &out)
        append(#","consent":"#, &out)
        JSONText.appendString(consent, to: &out)
        append(#","records":["#, &out)
    }

    /// Closes what `paramsHead` opened.
    static func paramsTail(into out: inout [UInt8]) { append("]}", &out) }

    /// One record. `name` is the event name's bytes (any bytes: escaped here), `properties` the
    /// properties' JSON text (an object), `tail` the instance's `"utm":…,"device":…` text.
    static func record(
        idPrefix: [UInt8], seq: UInt64, name: UnsafeRawBufferPointer, timeMs: Int64,
        euid: String?, session: String?, properties: UnsafeRawBufferPointer, tail: [UInt8],
        into out: inout [UInt8]
    ) {
        append(#"{"id":""#, &out)
        out.append(contentsOf: idPrefix)
        out.append(UInt8(ascii: "-"))
        JSONText.appendDecimal(seq, to: &out)
        out.append(UInt8(ascii: "\""))
        data(name: name, timeMs: timeMs, euid: euid, session: session, properties: properties, tail: tail, into: &out)
    }

    /// One record with the id `id` (a client's event id with its prefix, or a parked event's id).
    static func record(
        id: String, name: UnsafeRawBufferPointer, timeMs: Int64, euid: String?, session: String?,
        properties: UnsafeRawBufferPointer, tail: UnsafeRawBufferPointer, into out: inout [UInt8]
    ) {
        append(#"{"id":"#, &out)
        JSONText.appendString(id, to: &out)
        data(name: name, timeMs: timeMs, euid: euid, session: session, properties: properties, tail: tail, into: &out)
    }

    /// A record's `,"data":{…}}`, after its id.
    @inline(__always)
    private static func data<Tail: Collection<UInt8>>(
        name: UnsafeRawBufferPointer, timeMs: Int64, euid: String?, session: String?, properties: UnsafeRawBufferPointer,
        tail: Tail, into out: inout [UInt8]
    ) {
        append(#","data":{"event":"#, &out)
        JSONText.appendString(name, to: &out)
        append(#","time":"#, &out)
        JSONText.appendDecimal(timeMs, to: &out)
        append(#","euid":"#, &out)
        appendStringOrNull(euid, &out)
        append(#","session":"#, &out)
        appendStringOrNull(session, &out)
        append(#","properties":"#, &out)
        out.append(contentsOf: properties)
        out.append(UInt8(ascii: ","))
        out.append(contentsOf: tail)
        append("}}", &out)
    }

    /// `"utm":{…},"device":{…}` (utm omitted when empty; its keys sorted): the part of every
    /// record that changes only with the instance's settings.
    static func tail(utm: [String: String], device: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = []
        if !utm.isEmpty {
            append(#""utm":{"#, &out)
            for (i, k) in utm.keys.sorted().enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONText.appendString(k, to: &out)
                out.append(UInt8(ascii: ":"))
                JSONText.appendString(utm[k]!, to: &out)
            }
            append("},", &out)
        }
        append(#""device":{"#, &out)
        for (i, (k, v)) in device.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            JSONText.appendString(k, to: &out)
            out.append(UInt8(ascii: ":"))
            JSONText.appendString(v, to: &out)
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    // MARK: JSON text

    @inline(__always) static func append(_ s: StaticString, _ out: inout [UInt8]) {
        out.append(contentsOf: UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

    static func appendStringOrNull(_ s: String?, _ out: inout [UInt8]) {
        if let s { JSONText.appendString(s, to: &out) } else { append("null", &out) }
    }

}
