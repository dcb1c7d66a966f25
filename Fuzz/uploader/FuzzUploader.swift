import FuzzSupport
import PylonPluginKit
import pylon_uploader

/// Fuzz target (d, uploader): the uploader's configuration and stream policy. The input is parsed
/// by json-c and read as the plugin's config section (`UploaderConfig`, with `EndpointRule` on
/// every endpoint), as a caller's `_pylon` (`Principal`), and its strings as stream names and
/// owner labels (`StreamCatalog` consent keys, settings, ownership, `decide`).
///
/// This target links the plugin's library (`pylon_uploader`), so the code is fuzzed exactly as
/// shipped; what it calls is `package` there.
///
/// Properties: nothing traps; an accepted config's endpoints pass `EndpointRule`; settings stay
/// within their limits; `StreamOwner` labels round-trip.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let ref = try? JSONRef.parse(input, maxDepth: 64) else { return 0 }
    let j = ref.json

    let config = (try? UploaderConfig(j)) ?? UploaderConfig()
    let caller = Principal(caller: j["_pylon"])
    var names: [String] = ["ma.app", "soak", ""]
    collectStrings(j, into: &names)
    for name in names.prefix(32) {
        if let owner = StreamOwner(name) {
            fuzzCheck(StreamOwner(owner.description) == owner, "owner \(name) does not round-trip")
            _ = config.limits.diskBytes(for: owner)
        }
        _ = config.catalog.consentKey(for: name)
        let s = config.catalog.settings(for: name, defaultEndpoint: config.defaultEndpoint)
        fuzzCheck(s.maxCount >= 1 && s.maxCount <= StreamSettings.maxCountLimit, "maxCount \(s.maxCount) out of range")
        if case .failure = EndpointRule.check(s.endpoint, allowedHosts: config.allowedHosts) {
            fuzzCheck(false, "an accepted config yields endpoint \(s.endpoint), which EndpointRule refuses")
        }
        let owner = config.catalog.owner(of: name, recorded: StreamOwner(name))
        _ = StreamAccess.decide(name, owner: owner, caller: caller, action: "enqueue to", claims: true)
        _ = StreamAccess.decide(name, owner: owner, caller: caller, action: "read", claims: false)
        _ = EndpointRule.check(name, allowedHosts: config.allowedHosts)
    }
    return 0
}

func collectStrings(_ j: JSON, into out: inout [String]) {
    guard out.count < 64 else { return }
    switch j {
    case .string(let s): out.append(s)
    case .array(let a): for e in a { collectStrings(e, into: &out) }
    case .object(let o): for (k, v) in o { out.append(k); collectStrings(v, into: &out) }
    default: break
    }
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}
