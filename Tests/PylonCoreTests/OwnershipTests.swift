import PylonPluginKit
import Testing

/// The one ownership rule of uploader streams, MA AppKeys and push appIds (`Ownership`): the
/// first writer claims, the owner and admins use, nobody else; "admin" is the host's flag only;
/// only an admin hands a resource over or releases it.
@Suite struct OwnershipTests {
    let user = CallerInfo(client: 3, uid: 1000, gid: 1000, pid: 9)
    let other = CallerInfo(client: 4, uid: 65534, gid: 65534, pid: 10)
    let root = CallerInfo(client: 5, uid: 0, gid: 0, pid: 11, admin: true)
    /// uid 0 connected while `disclosure.admins` does not list it: the host writes no flag.
    let rootNotAdmin = CallerInfo(client: 6, uid: 0, gid: 0, pid: 12)
    let ma = CallerInfo(plugin: "ma")
    let gtmForUser = CallerInfo(client: 3, uid: 1000, plugin: "gtm")
    let anonymous = CallerInfo()

    static let rules: [Ownership] = [.streams, .appKeys, .pushApps]

    @Test(arguments: rules) func theOwnerAndAdminsUseItNobodyElse(rule: Ownership) {
        let owner = Owner.uid(1000)
        #expect(rule.access(owner, caller: user, claims: true) == .owner)
        #expect(rule.access(owner, caller: user, claims: false) == .owner)
        #expect(rule.access(owner, caller: root, claims: false) == .admin)
        #expect(rule.access(owner, caller: other, claims: false) == .refused(owner: owner))
        #expect(rule.access(owner, caller: other, claims: true) == .refused(owner: owner))
        #expect(rule.access(owner, caller: anonymous, claims: true) == .refused(owner: owner))
    }

    @Test(arguments: rules) func uidZeroWithoutTheHostsFlagIsAnOrdinaryUid(rule: Ownership) {
        #expect(rule.access(.uid(1000), caller: rootNotAdmin, claims: false) == .refused(owner: .uid(1000)))
        #expect(rule.access(.uid(0), caller: rootNotAdmin, claims: false) == .owner)
        #expect(!Ownership.mayHandOver(rootNotAdmin))
        #expect(!CallerInfo(uid: 0, admin: false).isAdmin)
    }

    @Test(arguments: rules) func theFirstWriterClaims(rule: Ownership) {
        #expect(rule.access(nil, caller: user, claims: true) == .claim(.uid(1000)))
        #expect(rule.access(nil, caller: root, claims: true) == .claim(.uid(0)), "an admin's write claims too")
    }

    @Test func onlyAnAdminHandsOver() {
        #expect(Ownership.mayHandOver(root))
        #expect(Ownership.mayHandOver(CallerInfo(uid: 1000, admin: true)), "any uid the host lists")
        for c in [user, other, rootNotAdmin, ma, gtmForUser, anonymous] { #expect(!Ownership.mayHandOver(c), "\(c)") }
    }

    @Test func streamsBelongToThePluginThatWritesThem() {
        let r = Ownership.streams
        #expect(r.identity(of: gtmForUser) == .plugin("gtm"))
        #expect(r.access(nil, caller: ma, claims: true) == .claim(.plugin("ma")))
        #expect(r.access(.plugin("ma"), caller: CallerInfo(client: 3, uid: 1000, plugin: "ma"), claims: true) == .owner)
        #expect(r.access(.uid(1000), caller: gtmForUser, claims: false) == .refused(owner: .uid(1000)))
        // Reading a stream nobody owns: admins only; an anonymous write cannot claim.
        #expect(r.access(nil, caller: user, claims: false) == .refused(owner: nil))
        #expect(r.access(nil, caller: root, claims: false) == .admin)
        #expect(r.access(nil, caller: anonymous, claims: true) == .refused(owner: nil))
    }

    @Test func appKeysAndAppsAreAUsersWhoeverRelaysTheCall() {
        for r in [Ownership.appKeys, .pushApps] {
            #expect(r.identity(of: gtmForUser) == .uid(1000))
            #expect(r.access(.uid(1000), caller: gtmForUser, claims: false) == .owner)
            #expect(r.access(.uid(1000), caller: ma, claims: false) == .refused(owner: .uid(1000)), "a plugin alone is nobody")
        }
        // An AppKey nobody owns is shared until a uid starts it; an app nobody owns is not.
        #expect(Ownership.appKeys.access(nil, caller: other, claims: false) == .unowned)
        #expect(Ownership.appKeys.access(nil, caller: ma, claims: true) == .unowned)
        #expect(Ownership.pushApps.access(nil, caller: other, claims: false) == .refused(owner: nil))
    }

    @Test func ownersAreWrittenAsTheyAreRead() {
        for o in [Owner.uid(0), .uid(1000), .plugin("ma")] { #expect(Owner(o.description) == o) }
        #expect(Owner("uid:-1") == nil && Owner("uid:") == nil && Owner("plugin:") == nil && Owner("1000") == nil)
        #expect(Owner.uid(7).uid == 7 && Owner.plugin("ma").uid == nil)
    }
}
