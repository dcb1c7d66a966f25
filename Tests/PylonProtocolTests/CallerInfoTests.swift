import PylonCore
import PylonProtocol
import Testing

/// `_pylon` has one writer (the host, `CallerInfo.serialized`) and one reader (the plugin kit,
/// `CallerInfo(text:)`): what one writes the other reads back.
@Suite struct CallerInfoTests {
    @Test func theHostsFormIsFixed() {
        #expect(CallerInfo(plugin: "ma").serialized == #"{"plugin":"ma"}"#)
        #expect(
            CallerInfo(client: 12, uid: 1000, gid: 100, pid: 4242).serialized == #"{"client":12,"uid":1000,"gid":100,"pid":4242}"#)
        #expect(
            CallerInfo(client: 3, uid: 0, gid: 0, pid: 7, plugin: "gtm", admin: true).serialized
                == #"{"plugin":"gtm","client":3,"uid":0,"gid":0,"pid":7,"admin":true}"#)
        #expect(CallerInfo().serialized == "{}")
        #expect(CallerInfo(plugin: "a\"b").serialized == #"{"plugin":"a\"b"}"#)
    }

    @Test func whatTheHostWritesThePluginReads() {
        let callers = [
            CallerInfo(), CallerInfo(plugin: "ma"), CallerInfo(client: 1, uid: 1000, gid: 1000, pid: 99),
            CallerInfo(client: 2, uid: 0, gid: 0, pid: 1, admin: true), CallerInfo(client: 9, uid: 5, gid: 5, pid: 5, plugin: "gtm"),
            CallerInfo(plugin: "odd \"name\" \\ é"),
        ]
        for c in callers {
            let back = Array(c.serialized.utf8).withUnsafeBytes { CallerInfo(text: $0) }
            #expect(back == c, "\(c.serialized)")
            #expect(CallerInfo(json: try? JSON.parse(c.serialized)) == c)
        }
        #expect(CallerInfo(text: nil) == CallerInfo())
    }

    @Test func adminIsTheFlagOnly() {
        #expect(CallerInfo(uid: 0).isAdmin == false)
        #expect(CallerInfo(uid: 0, admin: false).isAdmin == false)
        #expect(CallerInfo(uid: 1000, admin: true).isAdmin)
    }
}
