import CJSONC
import FuzzSupport
import PylonPluginKit

/// Fuzz target (d, MA): the MA plugin's parameter validation, on params parsed by json-c as the
/// plugin receives them. `EventValidation` (eventRecord, on the json-c tree and on Swift
/// values), `PropertyValidation` (setProperty/increase/add/remove, object_array element targets)
/// and `IdentityInput` (identifyAccount normalisation).
///
/// The plugin is an executable, which another executable cannot link: this target compiles the
/// plugin's own validation files (symlinks to Plugins/ma/EventValidation.swift,
/// PropertyValidation.swift, Identity.swift), so they are fuzzed exactly as shipped.
///
/// Properties: nothing traps; the json-c and the Swift-value forms of the event check agree;
/// an accepted property map holds 1 to 100 names that each pass `checkName`.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let ref = try? JSONRef.parse(input, maxDepth: 128) else { return 0 }
    let p = ref.json

    let onTree = EventValidation.check(eventNameRef: ref.member("eventName"), propertyRef: ref.member("property"))
    let onValues = EventValidation.check(eventName: p["eventName"], property: p["property"])
    fuzzCheck(
        (onTree == nil) == (onValues == nil), "event checks disagree: \(String(describing: onTree)) / \(String(describing: onValues))")

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

/// The plugin's error type (Plugins/ma/MAService.swift, which this target does not compile).
struct MAError: Error {
    let message: String
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}
