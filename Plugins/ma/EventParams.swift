import CJSONC
import PylonPluginKit

/// What the params of an `ma.eventRecord` say: the AppKey they name, and the event as it goes
/// into its record (name bytes, properties as json-c prints them) or the -3 message of the first
/// check it fails (`EventValidation`).
///
/// Read by one of two readers that agree on every input: `read(raw:)` from the params' JSON
/// text, building nothing (nil when the bytes alone cannot say what json-c would read: a key,
/// name or AppKey written with escapes, a repeated key, an integer json-c rewrites), and
/// `init(ref:)` from the json-c tree, which the caller then builds from the same text. Requests
/// as apps write them take the first; a test of generated requests holds the two to the same
/// answers.
struct EventParams: Equatable {
    /// `params.appKey` when it is a string, as written (not trimmed).
    var appKey: String?
    /// nil when the event passed every check; else the -3 message naming the field.
    var invalid: String?
    /// Where `name` and `properties` point: nil for the params' text itself, else these bytes.
    var storage: [UInt8]?
    /// The event name's bytes (its string value).
    var name: Range<Int> = 0..<0
    /// The properties' JSON text as json-c prints it (compact); nil when there are none.
    var properties: Range<Int>?

    /// Calls `body` with the event's name bytes and properties text (`{}` when none). `params`:
    /// the text this was read from.
    func withEvent<R>(params: UnsafeRawBufferPointer, _ body: (_ name: UnsafeRawBufferPointer, _ properties: UnsafeRawBufferPointer) -> R)
        -> R
    {
        func call(_ t: UnsafeRawBufferPointer) -> R {
            let n = UnsafeRawBufferPointer(rebasing: t[name])
            guard let properties else { return EventParams.noProperties.withUnsafeBytes { body(n, $0) } }
            return body(n, UnsafeRawBufferPointer(rebasing: t[properties]))
        }
        guard let storage else { return call(params) }
        return storage.withUnsafeBytes { call($0) }
    }

    /// The properties of an event that has none.
    static let noProperties = Array("{}".utf8)

    private init() {}

    /// Reads the params' text: from its bytes when they are plain enough, else through json-c.
    static func read(_ params: UnsafeRawBufferPointer) -> EventParams {
        if let p = read(raw: params) { return p }
        guard let tree = try? JSONRef.parse(params, maxDepth: Plugin.maxDepth) else { return EventParams(ref: nil) }
        return EventParams(ref: tree.ptr)
    }

    // MARK: From a json-c tree

    /// Reads params from their json-c object (borrowed); the event's bytes are copied out.
    init(ref params: OpaquePointer?) {
        appKey = MAService.appKeyParam(params)
        var nameRef: OpaquePointer?
        var props: OpaquePointer?
        _ = json_object_object_get_ex(params, "eventName", &nameRef)
        _ = json_object_object_get_ex(params, "property", &props)
        if let why = EventValidation.check(eventNameRef: nameRef, propertyRef: props) {
            invalid = why
            return
        }
        // Checked: the name is a string, the properties an object or absent/null.
        var bytes = Array(UnsafeRawBufferPointer(start: json_object_get_string(nameRef), count: Int(json_object_get_string_len(nameRef))))
        name = 0..<bytes.count
        var len = 0
        if json_object_get_type(props) == json_type_object, let c = json_object_to_json_string_length(props, flagsPlain, &len) {
            bytes.append(contentsOf: UnsafeRawBufferPointer(start: c, count: len))
            properties = name.upperBound..<bytes.count
        }
        storage = bytes
    }

    // MARK: From the params' text

    /// Reads params from their JSON text (valid JSON), or nil when json-c might read them
    /// differently from their bytes (see the type's comment).
    static func read(raw t: UnsafeRawBufferPointer) -> EventParams? {
        let first = RawJSON.skipSpace(t, 0)
        guard first < t.count, t[first] == UInt8(ascii: "{") else { return nil }
        // The last of a repeated key wins, as in json-c.
        var appKey: Range<Int>?
        var eventName: Range<Int>?
        var property: Range<Int>?
        /// The length of what json-c would print for `property` when it is an object.
        var printed = 0
        var members = RawJSON.MemberCursor(t, first..<t.count)
        while let m = members.nextKey() {
            if m.keyEscaped { return nil }
            switch m.key.count {
            case 6 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "appKey"): appKey = members.skipValue()
            case 9 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "eventName"): eventName = members.skipValue()
            case 8 where RawJSON.equals(t, m.key.lowerBound, m.key.upperBound, "property"):
                guard t[m.valueStart] == UInt8(ascii: "{") else {
                    property = members.skipValue()
                    continue
                }
                // Measured and skipped in one walk; nil: json-c's text is not certain from the bytes.
                guard let (length, end) = RawJSON.jsonCText(t, at: m.valueStart) else { return nil }
                property = m.valueStart..<end
                printed = length
                members.resume(at: end)
            default: break
            }
        }
        var p = EventParams()
        if let s = appKey, t[s.lowerBound] == UInt8(ascii: "\"") {
            guard let k = RawJSON.plainString(t, s) else { return nil }
            p.appKey = k
        }
        guard let n = eventName, t[n.lowerBound] == UInt8(ascii: "\"") else {
            p.invalid = EventValidation.nameRequired
            return p
        }
        let name = (n.lowerBound + 1)..<(n.upperBound - 1)
        guard !RawJSON.contains(t, name, UInt8(ascii: "\\")) else { return nil }
        if let why = EventValidation.checkName(UnsafeRawBufferPointer(rebasing: t[name])) {
            p.invalid = why
            return p
        }
        p.name = name
        guard let s = property, !RawJSON.equals(t, s.lowerBound, s.upperBound, "null") else { return p }
        guard t[s.lowerBound] == UInt8(ascii: "{") else {
            p.invalid = EventValidation.propertyNotObject
            return p
        }
        switch EventValidation.checkProperties(text: t, s) {
        case .unsure: return nil
        case .invalid(let why):
            p.invalid = why
            return p
        case .valid: break
        }
        if printed == s.count {
            p.properties = s  // already compact: json-c's text
            return p
        }
        // Whitespace between tokens: the name and the compacted properties go to storage.
        var bytes = [UInt8](repeating: 0, count: name.count + printed)
        bytes.withUnsafeMutableBytes { out in
            out.copyMemory(from: UnsafeRawBufferPointer(rebasing: t[name]))
            _ = RawJSON.jsonCText(t, s, into: out.baseAddress! + name.count)
        }
        p.storage = bytes
        p.name = 0..<name.count
        p.properties = name.count..<bytes.count
        return p
    }
}
