import PylonClientKit

/// `pylonctl owner`: admins hand an uploader stream, an MA AppKey or a push appId to another uid,
/// or release it (the next writer claims it). The plugins decide who may: the host's admin flag
/// only (docs/SECURITY.md, "Ownership hand-over").
let ownerUsage = """
    usage: pylonctl owner set uploader STREAM OWNER   uploader.setOwner (OWNER: uid:N, N or plugin:NAME)
           pylonctl owner set ma APPKEY UID           ma.setOwner (UID: N or uid:N)
           pylonctl owner set push APPID UID          push.setOwner (UID: N or uid:N)
           pylonctl owner release uploader|ma|push NAME   no owner: the next writer claims it
      For admins (disclosure.admins). Prints the plugin's answer: the new owner and the previous
      one. A refusal is exit 77 (uploader) or 65 (ma, push: their reply's "code" is not 0).
    """

/// `N` or `uid:N` as a uid; nil when it is neither.
func parseUid(_ s: String) -> Int64? {
    let digits = s.hasPrefix("uid:") ? String(s.dropFirst(4)) : s
    guard let n = Int64(digits), n >= 0, n <= Int64(UInt32.max) else { return nil }
    return n
}

@MainActor func ownerCommand(_ args: [String]) {
    let release = args.first == "release"
    guard (args.first == "set" && args.count == 4) || (release && args.count == 3) else { fail(ownerUsage, code: 64) }
    let plugin = args[1]
    let name = args[2]
    let owner = release ? nil : args[3]
    let method: String
    var p: JSONObject
    switch plugin {
    case "uploader":
        method = "uploader.setOwner"
        p = ["stream": .string(name)]
        if let owner {
            // A bare number is a uid.
            let o = parseUid(owner).map { "uid:\($0)" } ?? owner
            guard o.hasPrefix("uid:") || (o.hasPrefix("plugin:") && o.count > 7) else {
                fail("OWNER must be uid:N, N or plugin:NAME\n" + ownerUsage, code: 64)
            }
            p["owner"] = .string(o)
        } else {
            p["owner"] = .null
        }
    case "ma", "push":
        method = plugin + ".setOwner"
        p = [plugin == "ma" ? "appKey" : "appId": .string(name)]
        if let owner {
            guard let uid = parseUid(owner) else { fail("UID must be N or uid:N\n" + ownerUsage, code: 64) }
            p["uid"] = .int(uid)
        } else {
            p["uid"] = .null
        }
    default:
        fail("PLUGIN must be uploader, ma or push\n" + ownerUsage, code: 64)
    }
    let r = call(method, .object(p))
    print(text(r))
    if let c = r["code"]?.intValue, c != 0 {
        fail("reply code \(c)" + (r["message"]?.stringValue.map { ": " + $0 } ?? ""), code: 65)
    }
}
