"""Chinese customer-service conversations for the retention evaluation (issue 39), as the design sources describe.

The same plan as the English ones (:mod:`recallserve.serve.context._eval_data`): 59 turns, a burst of
five customer messages at turns 1, 10, 30 and 50 planting 8 constraints and 12 facts, filler turns
of a support chat with agent replies of four to eight sentences and some tool calls, the question
at turn 60. The items are written the way Chinese customers write them: 必须 / 不要 / 只能 / 禁止 /
务必 / 请勿 rules, amounts in 元, dates as 3月15日, times as 上午9点30分, a titled customer (张总) and a
titled colleague (陈思远主管), mainland mobile numbers, addresses with 区 / 路 / 号.

Seeds: 0-2 were read while the Chinese rules of the categoriser and the entity table were
written (dev); 100-109 were never looked at before the figures were taken (held out). The
figures are reported for both (docs/languages.md); nothing is tuned on either.
"""

from __future__ import annotations

import random

from recallserve.serve.context._eval_data import (
    TOOL_OUTPUTS,
    Conversation,
    LanguagePack,
    PlantedItem,
    draw_conversation,
)

__all__ = ["build_conversation_zh", "CHINESE", "DEV_SEEDS", "HELD_OUT_SEEDS"]

DEV_SEEDS = (0, 1, 2)
HELD_OUT_SEEDS = tuple(range(100, 110))

_SURNAMES = ["张", "李", "王", "刘", "陈", "杨", "赵", "黄", "周", "吴", "徐", "孙"]
_CUSTOMER_TITLES = ["总", "先生", "女士", "经理"]
_GIVEN = ["思远", "子涵", "浩然", "雨桐", "俊杰", "欣怡", "博文", "梓萱", "明轩", "静怡"]
_AGENT_TITLES = ["主管", "工程师", "专员", "经理"]
_CARRIERS = ["顺丰", "京东物流", "圆通", "中通", "申通", "韵达", "德邦", "EMS"]
_DISTRICTS = ["朝阳区建国路", "海淀区中关村大街", "浦东新区世纪大道", "天河区体育西路", "南山区科技园路", "武侯区人民南路"]
_CITIES = [("北京市", "100020"), ("上海市", "200120"), ("广州市", "510620"), ("深圳市", "518057"),
           ("成都市", "610041"), ("杭州市", "310012")]
_MATERIALS = ["乳胶", "镍", "羊毛脂", "蜂蜡"]
_COMPANIES = ["星辰营销公司", "鸿远数据公司", "汇通推广公司", "博达外呼中心"]
_PRODUCTS = [("咖啡机", "KF"), ("扫地机器人", "SD"), ("升降桌", "SJ"), ("空气净化器", "JH"), ("电动车电池", "DC")]
_COLOURS = ["深空灰", "薄荷绿", "焦糖橙", "午夜蓝"]
_DOMAINS = ["oakmail.net", "quillpost.org", "fernbox.io", "tidewater.email"]
_PINYIN = {"张": "zhang", "李": "li", "王": "wang", "刘": "liu", "陈": "chen", "杨": "yang", "赵": "zhao",
           "黄": "huang", "周": "zhou", "吴": "wu", "徐": "xu", "孙": "sun"}
_PARTS = ["接水盘", "滚刷", "电机外壳", "滤网框"]


def _plant_pool(rng: random.Random, customer: str) -> list[PlantedItem]:
    """The 8 constraints and 12 facts of one conversation, values drawn from ``rng``."""
    hour = rng.choice([9, 10, 11])
    minute = rng.choice([15, 30, 45])
    call_time = f"{hour}点{minute}分"
    budget = f"{rng.randint(3, 9)}{rng.randint(0, 9)}{rng.choice([0, 5])}0元"
    deadline = f"{rng.randint(1, 12)}月{rng.randint(11, 27)}日"
    good, bad = rng.sample(_CARRIERS, 2)
    office = f"{rng.choice(_DISTRICTS)}{rng.randint(100, 480)}号"
    ticket = f"GD-{rng.randint(100000, 999999)}"
    material = rng.choice(_MATERIALS)
    company = rng.choice(_COMPANIES)
    order = f"DD{rng.randint(10**9, 10**10 - 1)}"
    paid = f"{rng.randint(150, 990)}.{rng.randint(10, 99)}元"
    card4 = f"{rng.randint(1000, 9999)}"
    placed = f"2026年{rng.randint(1, 12)}月{rng.randint(2, 28)}日"
    phone = f"1{rng.choice([3, 5, 8])}{rng.randint(0, 9)}{rng.randint(10**7, 10**8 - 1)}"
    product, brand = rng.choice(_PRODUCTS)
    model = f"{brand}-{rng.randint(1000, 9999)}X"
    colour = rng.choice(_COLOURS)
    account = f"{rng.randint(10_000_000, 99_999_999)}"
    tracking = f"SF{rng.randint(10**11, 10**12 - 1)}"
    local = _PINYIN.get(customer[0], "kehu")
    domain = rng.choice(_DOMAINS)
    email = f"{local}.{rng.randint(10, 99)}@{domain}"
    agent = f"{rng.choice([s for s in _SURNAMES if s != customer[0]])}{rng.choice(_GIVEN)}{rng.choice(_AGENT_TITLES)}"
    agent_day = f"{rng.randint(1, 12)}月{rng.randint(2, 28)}号"
    city, postcode = rng.choice(_CITIES)
    house = f"{city}{rng.choice(_DISTRICTS)}{rng.randint(2, 98)}号"
    double = f"{rng.randint(20, 140)}.{rng.randint(10, 99)}元"
    member = f"HY-{rng.randint(10000, 99999)}"
    serial = f"SN{rng.randint(10**7, 10**8 - 1)}"
    part = rng.choice(_PARTS)
    c = "constraint"
    f = "fact"
    return [
        PlantedItem(c, f"请不要在上午{call_time}之前给我打电话，我上夜班。", ((call_time,),),
                    "早上几点以后可以给我打电话？"),
        PlantedItem(c, f"换货的预算最多{budget}，不要给我推荐更贵的。", ((budget,),), "我换货的预算是多少？"),
        PlantedItem(c, f"这件事必须在{deadline}之前解决，这是硬性截止日期。", ((deadline,),), "我说这件事最晚什么时候要解决？"),
        PlantedItem(c, f"给我送货只能用{good}，禁止用{bad}。", ((good,), (bad,)), "给我送货应该用哪家快递，不能用哪家？"),
        PlantedItem(c, f"不要寄到我公司的地址{office}，那里经常丢件。", ((office,),), "我说过不能寄到哪个地址？"),
        PlantedItem(c, f"以后联系我务必注明工单号{ticket}。", ((ticket,),), "联系我的时候要注明哪个工单号？"),
        PlantedItem(c, f"我对{material}过敏，替换的产品绝对不能含有这种材料。", ((material,),), "我对什么过敏？"),
        PlantedItem(c, f"请勿把我的信息透露给{company}，我已经退订了。", ((company,),), "我的信息不能透露给哪家公司？"),
        PlantedItem(f, f"我的订单号是{order}。", ((order,),), "我的订单号是多少？"),
        PlantedItem(f, f"我用尾号{card4}的银行卡付了{paid}。", ((paid,), (f"尾号{card4}", f"****{card4}")),
                    "我付了多少钱，用的哪张卡？"),
        PlantedItem(f, f"我是{placed}下的单。", ((placed,),), "我是哪天下的单？"),
        PlantedItem(f, f"我的手机号是{phone}。", ((f"****{phone[-4:]}", phone, f"尾号{phone[-4:]}"),), "你们登记的我的手机号是多少？"),
        PlantedItem(f, f"那台{product}是{colour}的，型号{model}。", ((model,),), "我的产品是什么型号？"),
        PlantedItem(f, f"我的会员账号是{account}。", ((f"****{account[-4:]}", account, f"尾号{account[-4:]}"),),
                    "我的会员账号是多少？"),
        PlantedItem(f, f"快递员给我的运单号是{tracking}。", ((tracking,),), "快递员给我的运单号是多少？"),
        PlantedItem(f, f"我的邮箱是{email}。", ((domain,),), "应该用哪个邮箱联系我？"),
        PlantedItem(f, f"我之前已经和你们的同事{agent}沟通过，是{agent_day}。", ((agent,),), "我之前和你们哪位同事沟通过？"),
        PlantedItem(f, f"我的收货地址是{house}，邮编{postcode}。", ((postcode,),), "我的收货地址是哪里？"),
        PlantedItem(f, f"我被重复扣款了，第二笔是{double}。", ((double,),), "重复扣的那笔是多少钱？"),
        PlantedItem(f, f"我的会员编号是{member}，坏掉的零件是{part}，序列号{serial}。", ((member,), (serial,)),
                    "我的会员编号和坏掉零件的序列号是多少？"),
    ]


_FILLER_Q = [
    "普通快递到我这边一般要几天？", "能不能把送货时间改到下午？", "我现在登录不了App，还有别的办法查进度吗？",
    "App一直提示登录过期，该怎么办？", "你们周末几点上班？", "这个型号有没有小一点的尺寸？",
    "如果包装已经拆开了还能退货吗？", "换货的时候能附一张纸质发票吗？", "打折买的东西还在保修期内吗？",
    "机器上的橙色灯一直闪是什么意思？", "能帮我查一下配件有没有库存吗？", "退款处理完会发邮件通知我吗？",
    "我不在家的话别人可以代签吗？", "换货可以走加急快递吗？", "怎么把机器恢复出厂设置？",
    "为什么物流信息从周二开始就没更新了？", "退款可以和购物券一起用吗？", "换的新机器带电源适配器吗？",
    "可以去附近的门店自提吗？", "滤网怎么清洗才不会弄坏？", "两种保修方案有什么区别？",
    "快递员找不到我们楼怎么办？", "退货标签需要我自己打印吗？", "会员买配件有折扣吗？",
    "退款一般要冻结多久？", "能再发一次确认邮件吗？我找不到了。", "包裹大概有多重？", "最新的固件更新有没有已知问题？",
]
_FILLER_A = [
    "感谢您的耐心等待，我正在为您查询。", "普通快递一般需要三到五个工作日，具体取决于地区和承运商的繁忙程度。",
    "我查看了系统，目前我们这边没有发现异常情况。", "周末客服从早上一直工作到傍晚，紧急情况也可以随时在线留言。",
    "如果App出现这个提示，完全退出后重新登录通常就能刷新会话。", "三十天内可以退货，只要配件齐全，拆封的商品也没有问题。",
    "保修覆盖产品本身的质量问题，和购买时是否打折没有关系。", "指示灯闪烁通常表示机器正在等待固件步骤完成，这时最好不要拔电源。",
    "我可以帮您申请纸质发票，仓库打印后会放在包裹里一起寄出。", "退款会原路返回，一般五到七个工作日内到账。",
    "只要代签的人在收货地址，快递员到达时就可以帮您签收。", "大部分换货都可以走加急快递，偏远地区可能会多一天。",
    "恢复出厂设置的方法是长按电源键十秒，直到屏幕闪两下。", "包裹在转运中心之间运输时，物流页面有时会暂停更新，重新扫描后就会恢复。",
    "有库存的商品可以选择门店自提，备好货后会给您发消息。", "滤网可以用温水冲洗，晾干一整天后再装回去。",
    "延保方案额外包含意外损坏，基础方案只包含质量问题。", "如果快递员找不到楼，会打订单上的联系电话或者留下取件通知。",
    "不需要打印机，退货标签可以在任何寄件点出示二维码。", "会员购买配件会自动享受折扣，登录后结算时就能看到。",
    "在此期间如果还有其他需要帮忙的地方，请随时告诉我。", "我已经在您的工单里添加了备注，同事们都能看到完整的记录。",
    "我理解这件事让您很困扰，非常感谢您的理解。", "最新固件修复了一个连接问题，目前没有收到新的故障反馈。",
    "我已经看过之前的沟通记录，您不用再重复已经说过的内容。", "物流合作方在夜间更新系统，所以早上的信息通常最准确。",
    "如果我们这边有任何变化，您会通过邮件和App收到自动通知。", "出于安全考虑，请不要自行拆开机壳，否则可能影响保修判定。",
    "换货的机器在发出前都经过测试，底部贴有新的质检标签。", "如果您需要，我也可以安排技术团队给您回电，一步步指导设置。",
    "大多数客户在更新后重启一次，问题就解决了。", "您的工单目前标记为优先处理，每个工作日至少会被复核一次。",
    "如果原包装还在，请保留好，退货运输时最能保护机器。", "我再次核对了订单记录，可以确认您提到的内容都已经记录在案。",
    "仓库确认发货后，物流信息通常几个小时内就能查到。", "单独购买的配件不受换货影响，可以继续使用。",
]
_FILLER_CONTEXT = [
    "如果可以的话，我希望今天就能处理好。", "我邻居上个月也遇到类似的问题，拖了很久。", "如果之前问过了请见谅，今天实在太忙了。",
    "我问这个是因为说明书写得不太清楚。", "上次联系你们的时候聊到一半就断线了。", "我只是想确认一下我理解的流程没错。",
    "不着急，就是想了解一下。", "我家人也让我顺便问一下。",
]
_ACKS = ["好的，我已经把这些都记录在您的工单里了。", "明白了，这些信息已经添加到您的档案中。",
         "谢谢，都已经记下来了，我这就帮您处理。", "收到，这些信息已经保存在您的工单里。"]

CHINESE = LanguagePack(
    customer=lambda rng: f"{rng.choice(_SURNAMES)}{rng.choice(_CUSTOMER_TITLES)}",
    plant_pool=_plant_pool, intro="你好，我是{customer}。", questions=_FILLER_Q, answers=_FILLER_A,
    context=_FILLER_CONTEXT, acks=_ACKS, tools=TOOL_OUTPUTS, joiner="",
)


def build_conversation_zh(seed: int) -> Conversation:
    """A deterministic 59-turn Chinese conversation for ``seed`` (turn 60 is the evaluation question).

    Example:
        >>> conv = build_conversation_zh(100)
        >>> len(conv.turns), len(conv.items), conv.turns[0].user[0].startswith("你好，我是")
        (59, 20, True)
    """
    return draw_conversation(seed, CHINESE)
