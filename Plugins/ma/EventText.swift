import CJSONC
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
        append(#"","data":{"event":"#, &out)
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

/// A json-c node that serialises as JSON text written elsewhere (json-c's
/// `json_object_set_serializer`): the enqueue's params go to `Plugin.callRaw` without being built
/// as a tree. The text must be one valid JSON value.
enum PrebuiltJSON {
    private final class Text {
        var bytes: [UInt8]
        let released: (inout [UInt8]) -> Void
        init(_ bytes: [UInt8], _ released: @escaping (inout [UInt8]) -> Void) {
            self.bytes = bytes
            self.released = released
        }
        deinit {
            var b: [UInt8] = []
            swap(&b, &bytes)
            released(&b)  // uniquely referenced here, so its storage can be kept
        }
    }

    /// A new node (one reference, owned by the caller) that serialises as `text`; `released`
    /// gets the text back when json-c frees the node (to reuse its buffer).
    static func node(_ text: [UInt8], released: @escaping (inout [UInt8]) -> Void = { _ in }) -> OpaquePointer? {
        // The node's own type is never seen: the serializer below replaces its text.
        let node = json_object_new_boolean(0)
        let box = Unmanaged.passRetained(Text(text, released)).toOpaque()
        json_object_set_serializer(
            node,
            { jso, pb, _, _ in
                let t = Unmanaged<Text>.fromOpaque(json_object_get_userdata(jso)!).takeUnretainedValue()
                let n = t.bytes.withUnsafeBytes { b in
                    printbuf_memappend(pb, b.baseAddress!.assumingMemoryBound(to: CChar.self), Int32(b.count))
                }
                return n < 0 ? -1 : 0
            }, box, { _, userdata in Unmanaged<Text>.fromOpaque(userdata!).release() })
        return node
    }
}
