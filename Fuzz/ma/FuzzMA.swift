import FuzzSupport
import PylonPluginKit
import pylon_ma

/// Fuzz target (d, MA): the MA plugin's parameter validation, on params json-c accepts (as the
/// host checks them). `EventParams`/`EventValidation` (eventRecord, its one reader, on the text),
/// `PropertyValidation` (setProperty/increase/add/remove, object_array element targets)
/// and `IdentityInput` (identifyAccount normalisation).
///
/// This target links the plugin's library (`pylon_ma`), so the code is fuzzed exactly as shipped;
/// what it calls is `package` there.
///
/// Properties: nothing traps; an accepted event's properties are canonical (reading them again
/// gives the same bytes), parse with json-c as an object of at most 500 entries whose keys pass
/// `checkKey`, and its name passes `checkName`; an accepted property map holds 1 to 100 names
/// that each pass `checkName`.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let ref = try? JSONRef.parse(input, maxDepth: 128) else { return 0 }
    let p = ref.json

    let event = EventParams.read(input)
    if event.invalid == nil {
        event.withEvent(params: input) { name, properties in
            fuzzCheck(EventValidation.checkName(name) == nil, "accepted event name \(String(decoding: name, as: UTF8.self))")
            fuzzCheck(RawJSON.canonicalBytes(properties).elementsEqual(properties), "properties are not canonical")
            guard let o = (try? JSONRef.parse(properties, maxDepth: 300))?.json.objectValue else {
                fuzzCheck(false, "accepted properties json-c cannot read as an object")
                return
            }
            fuzzCheck(o.count <= EventValidation.maxProperties, "accepted \(o.count) properties")
            for (k, _) in o { fuzzCheck(Array(k.utf8).withUnsafeBytes { EventValidation.checkKey($0) } == nil, "accepted key \(k)") }
        }
    }

    if case .success(let props) = PropertyValidation.setProperties(p) {
        fuzzCheck((1...PropertyValidation.maxPerCall).contains(props.count), "accepted \(props.count) properties")
        for (k, _) in props { fuzzCheck(PropertyValidation.checkName(k) == nil, "accepted property name \(k)") }
    }
    _ = PropertyValidation.keyed(p, PropertyValidation.isFiniteNumber, what: "by must be a finite number")
    _ = PropertyValidation.keyed(p, PropertyValidation.isStringArray, what: "must be an array of strings")
    if case .success(let t) = PropertyValidation.elementTarget(p) { _ = JSON.object(t.body(op: "update")).serialized }

    if p.objectValue != nil { _ = IdentityInput(p) }
    return 0
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}
