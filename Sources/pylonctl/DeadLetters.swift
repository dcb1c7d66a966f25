import PylonClientKit

/// `pylonctl dead-letters`: the uploader's dead letters (docs/UPLOADER.md "uploader.deadLetters").
/// The uploader decides who may see and change what: a stream's owner or an admin.
let deadLettersUsage = """
    usage: pylonctl dead-letters list [STREAM [LIMIT]]    uploader.deadLetters (no STREAM: all you may see)
           pylonctl dead-letters requeue STREAM [ID...]   uploader.requeue (no ID: every dead letter of STREAM)
           pylonctl dead-letters discard STREAM [ID...]   uploader.discard (no ID: every dead letter of STREAM)
    """

@MainActor func deadLettersCommand(_ args: [String]) {
    switch args.first {
    case "list" where args.count <= 3:
        var p: JSONObject = [:]
        if args.count > 1 { p["stream"] = .string(args[1]) }
        if args.count > 2 {
            guard let n = Int64(args[2]) else { fail("LIMIT must be an integer\n" + deadLettersUsage, code: 64) }
            p["limit"] = .int(n)
        }
        print(call("uploader.deadLetters", .object(p)).serialized)
    case "requeue" where args.count >= 2, "discard" where args.count >= 2:
        var p: JSONObject = ["stream": .string(args[1])]
        if args.count > 2 { p["ids"] = .array(args[2...].map { .string($0) }) }
        print(call(args[0] == "requeue" ? "uploader.requeue" : "uploader.discard", .object(p)).serialized)
    default:
        fail(deadLettersUsage, code: 64)
    }
}
