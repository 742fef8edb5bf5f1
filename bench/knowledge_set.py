"""A help centre and the questions its visitors ask, for ``bench.knowledge_quality``.

Sixteen products, each with four articles on the same four subjects (returns, care, warranty,
getting started), so that every product article has three close neighbours on the same product
and fifteen on the same subject; and fourteen general articles that overlap them (refunds,
delivery, payment, the account). The answerable questions are written as a visitor asks them,
in words the article does not use where the language allows (a product's name has no synonym);
each names the slug of the one article that answers it. The unanswerable questions are about
things the help centre does not cover, many sharing a word or a product with it.
"""

# name, return days, what to clean and how, warranty years, where the serial number is,
# the first thing to do on the first day, something that product is known to need.
PRODUCTS = [
    ("Larkspur blender", 30, "Rinse the jug with warm soapy water; the blade assembly unscrews and goes in the "
     "dishwasher's top rack", 2, "under the motor base", "Fit the jug on the base until it clicks and run it on "
     "pulse for ten seconds with water", "The lid must be locked or the motor will not start."),
    ("Tern kettle", 14, "Descale the heating plate monthly with a mixture of white vinegar and water, then boil "
     "twice with fresh water", 1, "on the bottom of the power stand", "Boil a full kettle and pour it away twice "
     "to remove the factory smell", "Never fill above the MAX mark."),
    ("Osprey vacuum cleaner", 30, "Empty the dust bin after every use and wash the foam filter under the tap "
     "every month, letting it dry for a day", 3, "behind the dust bin", "Charge the battery for four hours before "
     "the first use", "The brush roll lifts out to remove tangled hair."),
    ("Heron coffee grinder", 30, "Brush out the burrs weekly and grind a spoon of uncooked rice to absorb old "
     "oils; never wash the burrs with water", 2, "on the side of the hopper", "Set the dial to 15 for filter "
     "coffee and grind a small batch to season the burrs", "Oily dark roasts clog the chute faster."),
    ("Wren toaster", 14, "Unplug it, let it cool, slide out the crumb tray and empty it; wipe the outside with a "
     "damp cloth", 1, "under the crumb tray", "Run it empty on setting 5 once in a ventilated room to burn off "
     "the coating smell", "The bagel button only heats one side."),
    ("Kestrel air purifier", 30, "Vacuum the pre-filter every two weeks and replace the HEPA cartridge every "
     "twelve months", 5, "inside the filter door", "Remove the plastic bag around the filter cartridge before "
     "switching it on", "The colour ring shows the air quality: blue is clean, red is polluted."),
    ("Finch electric toothbrush", 60, "Rinse the brush head after each use and pull it off weekly to wipe the "
     "metal shaft; replace heads every three months", 2, "on the base of the handle", "Charge the handle "
     "overnight on its stand until the light stops blinking", "The two-minute timer pulses every thirty seconds."),
    ("Plover hair dryer", 30, "Twist off the rear grille and brush the lint from the filter every few weeks so "
     "the motor does not overheat", 2, "on the cord tag", "Choose the heat with the lower switch and the speed "
     "with the upper one; start on medium", "It switches itself off if the filter is blocked."),
    ("Lapwing rice cooker", 30, "Wash the inner bowl by hand with a soft sponge; the non-stick coating is ruined "
     "by scourers and dishwashers", 2, "on the back panel", "Rinse the rice until the water runs clear and use the "
     "lines inside the bowl for the water level", "Keep-warm starts on its own when the rice is done."),
    ("Curlew stand mixer", 30, "Wipe the head with a damp cloth; the bowl, whisk and dough hook go in the "
     "dishwasher but the flat beater is hand wash only", 5, "under the tilting head", "Lock the head down, fit "
     "the bowl by turning it clockwise and start at speed 1", "Knead bread dough at speed 2 at most."),
    ("Swift e-bike", 14, "Clean the frame with a sponge and mild soap, never a pressure washer, and oil the chain "
     "every 300 km", 2, "stamped under the bottom bracket", "Charge the battery fully, set the saddle height and "
     "pair the display with the app", "The motor assists up to 25 km/h."),
    ("Puffin humidifier", 30, "Empty the tank daily and clean it weekly with diluted citric acid to stop limescale "
     "and mould", 2, "under the water tank", "Fill the tank with cold tap water and set the humidity target to 45%",
     "Distilled water stops the white dust on furniture."),
    ("Dunlin desk lamp", 60, "Dust the LED panel with a dry microfibre cloth; no liquid cleaners on the touch "
     "strip", 3, "inside the weighted base", "Plug in the USB-C adapter and hold the touch strip to choose the "
     "colour temperature", "The LEDs are not replaceable but last about 50,000 hours."),
    ("Avocet espresso machine", 30, "Backflush the group head weekly with the cleaning tablets, purge the steam "
     "wand after every milk drink and descale every two months", 2, "under the drip tray", "Fill the water tank, "
     "run two empty shots to prime the pump and warm the cups", "Use 18 g of coffee in the double basket."),
    ("Bittern water filter jug", 30, "Hand wash the jug and lid in lukewarm water; swap the filter cartridge every "
     "four weeks", 1, "on the handle", "Soak a new cartridge for fifteen minutes and discard the first two jugs "
     "of water", "The lid counter reminds you when the cartridge is due."),
    ("Gannet pressure cooker", 30, "Take out the silicone sealing ring and the steam valve after every use and "
     "wash them separately", 5, "under the handle", "Do a water test: two cups of water at high pressure for "
     "five minutes", "Never open it before the float valve has dropped."),
]


def slug(name, subject):
    return f"{name.split()[0].lower()}-{subject}"


def product_articles():
    articles = []
    for name, days, care, years, serial, first, tip in PRODUCTS:
        articles += [
            (slug(name, "returns"), f"Returning your {name}",
             f"You can return the {name} within {days} days of delivery for a full refund, in its original "
             "packaging with every accessory. Start the return from Orders in your account, print the prepaid "
             f"label and drop the parcel at any post office. A used {name} that is not faulty is refunded minus "
             "a 10% restocking fee."),
            (slug(name, "care"), f"Cleaning and caring for the {name}",
             f"{care}. Always unplug the {name} or switch it off before cleaning. {tip}"),
            (slug(name, "warranty"), f"{name} warranty and repairs",
             f"The {name} has a {years}-year guarantee against manufacturing defects from the date of purchase. "
             f"To claim it, open a repair request with the serial number, which is {serial}, and a photo of the "
             "fault. We collect the product, repair or replace it, and send it back at no cost. Accidental damage "
             "is not covered."),
            (slug(name, "setup"), f"Getting started with the {name}",
             f"{first}. Read the safety leaflet in the box before the first use. Register the {name} in your "
             "account to keep the manual and the warranty papers in one place."),
        ]
    return articles


GENERAL_ARTICLES = [
    ("refund-timing", "When will I get my refund?",
     "Once the returned parcel reaches our warehouse, we inspect it within three working days. Refunds go back to "
     "the original payment method; banks take five to ten working days to show the money."),
    ("shipping-times", "Delivery times",
     "Orders placed before 2 pm leave the warehouse the same day. Standard delivery takes two to four working "
     "days, express delivery the next working day."),
    ("international-shipping", "Shipping abroad",
     "We deliver to every country in Europe and to the United States and Canada. Customs duties outside the "
     "European Union are paid by the recipient on arrival."),
    ("track-order", "Tracking a parcel",
     "The confirmation email holds a tracking link. You can also find the carrier's tracking number under "
     "Orders in your account once the parcel is dispatched."),
    ("payment-methods", "Payment methods",
     "We accept Visa, Mastercard, American Express, PayPal, Apple Pay and bank transfer. Cards are charged when "
     "the order ships."),
    ("invoices", "Invoices",
     "A PDF invoice is emailed when the order ships and can be downloaded under Orders. Business customers can "
     "add a VAT number at checkout."),
    ("gift-cards", "Gift cards",
     "Gift cards are valid for two years and can be used for several orders until the balance is spent. They "
     "cannot be exchanged for cash."),
    ("discount-codes", "Discount codes",
     "Enter a discount code in the basket before paying. Only one code applies per order, and codes do not "
     "combine with sale prices."),
    ("reset-password", "Resetting your password",
     "Click Forgot password on the sign-in page and follow the link we email you; it expires after one hour."),
    ("delete-account", "Closing your account",
     "Write to support from the email address of the account. We delete the account and its personal data "
     "within 30 days, keeping invoices as the law requires."),
    ("export-data", "Exporting your data",
     "Under Account, Privacy, choose Export to receive a ZIP file with your orders, addresses and messages."),
    ("contact-support", "Contacting support",
     "The support team answers by chat and email from 8 am to 8 pm, Monday to Saturday, and by phone on "
     "weekdays from 9 am to 5 pm."),
    ("store-locations", "Our shops",
     "You can see and try our products in the shops in Lyon, Ghent and Porto, open Tuesday to Saturday."),
    ("bicycle-parking", "Bicycle parking at our shops",
     "Every shop has covered bicycle racks at the entrance, free for customers during opening hours."),
]

ARTICLES = product_articles() + GENERAL_ARTICLES

# Ways a visitor asks about each subject; {p} is the product as a visitor names it. Questions
# are made by giving each product one or two of its subject's ways, taken in turn, so that every
# way is asked of several products and no product gets the same wording twice.
WAYS = {
    "returns": [
        "Until when can I send back my {p}?",
        "I changed my mind about the {p}, can I still get my money back?",
        "Is it too late to give back the {p} I bought five weeks ago?",
        "How many days do I have to bring back the {p}?",
        "I don't want the {p} any more, what do I do?",
        "Can I swap the {p} for cash if I opened the box?",
    ],
    "care": [
        "How should I wash my {p}?",
        "What's the best way to keep the {p} clean?",
        "My {p} is getting dirty, how do I clean it?",
        "Maintenance tips for the {p}?",
        "Can I put parts of the {p} in the dishwasher?",
    ],
    "warranty": [
        "My {p} broke, will you fix it for free?",
        "How long is the {p} guaranteed?",
        "The {p} stopped working after a few months, what now?",
        "Where do I find the serial number of my {p}?",
        "Is the {p} covered if it breaks down?",
    ],
    "setup": [
        "What do I do when I first unbox the {p}?",
        "How do I set up my new {p}?",
        "First time using the {p}, any tips?",
        "I just got the {p}, how do I begin?",
    ],
}
SECOND_WAY = {"returns", "warranty"}  # these subjects get two questions per product

GENERAL_QUESTIONS = [
    ("How long until my money is back on my card?", "refund-timing"),
    ("I returned something, when do I see the refund?", "refund-timing"),
    ("How fast do you deliver?", "shipping-times"),
    ("If I order this afternoon, when does it arrive?", "shipping-times"),
    ("Do you send orders to Canada?", "international-shipping"),
    ("Will I pay import fees in Switzerland?", "international-shipping"),
    ("Where is my package right now?", "track-order"),
    ("Can I pay using PayPal?", "payment-methods"),
    ("Do you take Apple Pay?", "payment-methods"),
    ("I need a receipt with my company's VAT number", "invoices"),
    ("How long can I use a voucher I got as a present?", "gift-cards"),
    ("Can I use two promo codes on one purchase?", "discount-codes"),
    ("I can't remember my login, help", "reset-password"),
    ("How do I get rid of my profile and everything you know about me?", "delete-account"),
    ("How do I export my data?", "export-data"),
    ("Can I download everything you store about me?", "export-data"),
    ("What time can I reach a human on the phone?", "contact-support"),
    ("Is there a store in Porto where I can see things in person?", "store-locations"),
    ("Where do I leave my bike when visiting a shop?", "bicycle-parking"),
]


def answerable_questions():
    """``[(question, slug)]``: every product article asked once or twice, and the general ones."""
    questions, turn = [], {subject: 0 for subject in WAYS}
    for name, *_ in PRODUCTS:
        spoken = name.split()[0] + " " + " ".join(name.split()[1:])
        for subject, ways in WAYS.items():
            for _ in range(2 if subject in SECOND_WAY else 1):
                questions.append((ways[turn[subject] % len(ways)].format(p=spoken), slug(name, subject)))
                turn[subject] += 1
    return questions + GENERAL_QUESTIONS


ANSWERABLE = answerable_questions()

UNANSWERABLE = [
    "When does the secret winter sale start?",
    "Do you sell lawn mowers?",
    "Can I return a sofa I bought in your shop?",
    "How do I descale a dishwasher?",
    "What is the warranty on your smartphones?",
    "Do you have a loyalty points programme?",
    "Are your employees paid a living wage?",
    "Can I pick up my order at a locker?",
    "Is the Larkspur blender available in pink?",
    "Do you offer student discounts?",
    "What's the wattage of the Tern kettle in the United Kingdom version?",
    "How do I become a reseller of your products?",
    "Can I rent an e-scooter from you?",
    "Do you recycle old fridges?",
    "Who is your chief executive?",
    "Can I have my order gift-wrapped?",
    "What is the capital of Portugal?",
    "Can you recommend a good recipe for sourdough?",
    "Is there a mobile app for ordering?",
    "Do you have job openings in Ghent?",
    "How do I assemble a wardrobe?",
    "Are your products vegan?",
    "Do you plant a tree for every order?",
    "What is the weather like in Lyon today?",
    "Does the Osprey vacuum cleaner work on Mars?",
    "How do I fix my car's brakes?",
    "Do you buy back used electronics?",
    "Can I book a cooking class at your shop?",
    "Is there a price match guarantee?",
    "How do I connect my television to the wifi?",
]

# Written after the built-in synonyms (conversations.knowledge.text.SYNONYMS), which were
# chosen while looking at the questions above: these show how much of their gain carries over
# to questions the list was not written for. Reported apart, never tuned on.
HELD_OUT = [
    ("Can I still return the Gannet pressure cooker after three weeks?", "gannet-returns"),
    ("What's the refund policy for the Wren toaster if I don't like it?", "wren-returns"),
    ("Is there a restocking charge if I return a used Heron coffee grinder?", "heron-returns"),
    ("How do I descale my Tern kettle?", "tern-care"),
    ("How often should the Kestrel air purifier filter be changed?", "kestrel-care"),
    ("How do I get hair out of the Osprey vacuum cleaner brush?", "osprey-care"),
    ("Does the Finch electric toothbrush have a timer?", "finch-care"),
    ("The Plover hair dryer keeps shutting off by itself", "plover-care"),
    ("How long will the Dunlin desk lamp LEDs last?", "dunlin-care"),
    ("When do I replace the Bittern water filter jug cartridge?", "bittern-care"),
    ("The Curlew stand mixer makes a grinding noise and won't turn, is it under warranty?", "curlew-warranty"),
    ("Who pays the postage when my Swift e-bike needs repairing?", "swift-warranty"),
    ("What should I do on day one with my Avocet espresso machine?", "avocet-setup"),
    ("How much water goes in the Lapwing rice cooker?", "lapwing-setup"),
    ("Which speed should I knead bread at on the Curlew stand mixer?", "curlew-care"),
    ("Is it safe to open the Gannet pressure cooker right away?", "gannet-care"),
    ("Do you accept American Express?", "payment-methods"),
    ("Can I combine a coupon with sale items?", "discount-codes"),
    ("Which countries do you deliver to?", "international-shipping"),
    ("My reset link doesn't work anymore", "reset-password"),
]

# Written in a later round, before any ranking change of that round was measured, in wordings of
# their own (none of WAYS'), on every subject and on products of both halves: the held-out
# questions of that round's tuning. bench.knowledge_quality reports them apart and lists no
# misses of theirs; they were never looked at while choosing weights.
FRESH = [
    ("What's the return window on the Curlew stand mixer?", "curlew-returns"),
    ("Do I lose money returning a used Dunlin desk lamp?", "dunlin-returns"),
    ("Can the Puffin humidifier go back if I've had it two weeks?", "puffin-returns"),
    ("I regret buying the Swift e-bike", "swift-returns"),
    ("How long do I have to return the Finch electric toothbrush?", "finch-returns"),
    ("Where do I print a return label for the Tern kettle?", "tern-returns"),
    ("How do I stop mould growing in the Puffin humidifier?", "puffin-care"),
    ("Can the Lapwing rice cooker bowl go in the dishwasher?", "lapwing-care"),
    ("How do I get rid of limescale in the Avocet espresso machine?", "avocet-care"),
    ("What cleaning does the Gannet pressure cooker need after cooking?", "gannet-care"),
    ("Should I use a pressure washer on the Swift e-bike?", "swift-care"),
    ("How do I look after the Heron coffee grinder burrs?", "heron-care"),
    ("Is the Larkspur blender blade dishwasher safe?", "larkspur-care"),
    ("What does the red light on the Kestrel air purifier mean?", "kestrel-care"),
    ("My Kestrel air purifier is faulty, what are my options?", "kestrel-warranty"),
    ("For how many years is the Osprey vacuum cleaner protected against defects?", "osprey-warranty"),
    ("I dropped my Wren toaster and it cracked, will you repair it?", "wren-warranty"),
    ("Serial number location on the Puffin humidifier", "puffin-warranty"),
    ("The Finch electric toothbrush has a defect, can I get a replacement?", "finch-warranty"),
    ("How long is the guarantee on the Gannet pressure cooker?", "gannet-warranty"),
    ("Does the Avocet espresso machine warranty cover me dropping it?", "avocet-warranty"),
    ("What's the first thing to do with a new Bittern water filter jug?", "bittern-setup"),
    ("How do I pair the Swift e-bike with the app?", "swift-setup"),
    ("Why does my new Wren toaster smell?", "wren-setup"),
    ("How long should I charge the Osprey vacuum cleaner before using it?", "osprey-setup"),
    ("Which dial setting for filter coffee on the Heron coffee grinder?", "heron-setup"),
    ("How do I get the Plover hair dryer going for the first time?", "plover-setup"),
    ("Does the Gannet pressure cooker need a test run?", "gannet-setup"),
    ("How do I prime the pump on my new Avocet espresso machine?", "avocet-setup"),
    ("How many working days before the refund shows in my bank?", "refund-timing"),
    ("Is next-day delivery possible?", "shipping-times"),
    ("Who pays customs for orders to Norway?", "international-shipping"),
    ("Where can I find my tracking number?", "track-order"),
    ("When is my card charged?", "payment-methods"),
    ("Can I get a PDF invoice?", "invoices"),
    ("Can I turn my gift card into cash?", "gift-cards"),
    ("Locked out of my account, what now?", "reset-password"),
    ("How do I close my account permanently?", "delete-account"),
    ("What hours is the chat open?", "contact-support"),
    ("Which cities have your shops?", "store-locations"),
    ("Is there somewhere to lock my bicycle at the Lyon shop?", "bicycle-parking"),
    ("Can I get a file with my orders and addresses?", "export-data"),
]

# Written in a later round still, after the floors above were chosen and before any change of that
# round was measured: questions a visitor of this help centre could ask, near its articles'
# subjects and products, that none of them answers. Reported apart (``bench.knowledge_quality
# --held-out``) and never tuned on: UNANSWERABLE was read while choosing every floor.
UNANSWERABLE_HELD_OUT = [
    "Does the Avocet espresso machine come with a milk jug?",
    "What voltage does the Swift e-bike charger use?",
    "How heavy is the Curlew stand mixer?",
    "Can I buy a spare jug for the Larkspur blender?",
    "Is the Kestrel air purifier quiet enough for a bedroom?",
    "Does the Osprey vacuum cleaner come with a pet hair attachment?",
    "How much does a replacement Bittern filter cartridge cost?",
    "Can the Gannet pressure cooker be used on an induction hob?",
    "Is it safe to put essential oils in the Puffin humidifier?",
    "What colours does the Dunlin desk lamp come in?",
    "Can I pay in monthly instalments?",
    "Do you deliver on Sundays?",
    "Can I change the delivery address after ordering?",
    "Can I cancel an order before it ships?",
    "How do I change the email address on my account?",
    "Can I place an order by phone?",
    "Can I buy an extended warranty?",
    "How do I unsubscribe from your newsletter?",
    "Are the Finch electric toothbrush heads recyclable?",
    "Does the Lapwing rice cooker have a delayed start timer?",
    "How loud is the Plover hair dryer in decibels?",
    "Does the Tern kettle have a temperature setting for green tea?",
    "Is there a car park at the Porto shop?",
    "Can I take the Swift e-bike on a train?",
    "Do you sell a spare battery for the Osprey vacuum cleaner?",
    "How do I write a review of a product I bought?",
    "Do you store my card details?",
    "Can I save a second delivery address in my account?",
    "Does the Wren toaster have a defrost setting?",
    "Which grind size should I use for espresso on the Heron coffee grinder?",
]
